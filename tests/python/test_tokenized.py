"""Datasets already tokenized (input_ids columns): read in place, trained as their text is."""

import json
import os
import re

import numpy as np
import pytest

import brisk
from brisk.data import tokenized_split
from conftest import FIXTURES, RUN, TINY_BERT, WORDPIECE, read_glue

BPE = os.path.join(FIXTURES, "tokenizer", "bpe")


def tokenized(columns):
    """The glue columns with input_ids from brisk's tokenizer (CLS ... SEP), label kept."""
    return {"input_ids": brisk.tokenize(WORDPIECE, columns["sentence"]),
            "label": columns["label"]}


def losses_of(tmp_path, name, train, eval_data=None, **changes):
    args = brisk.TrainingArguments(output_dir=str(tmp_path / name),
                                   **dict(RUN, max_seq_length=32, **changes))
    t = brisk.Trainer(model=dict(TINY_BERT), args=args, train_dataset=train, eval_dataset=eval_data,
                      tokenizer=WORDPIECE)
    t.train()
    return t, [(r["step"], r["loss"]) for r in t.state.log_history if "loss" in r]


def test_tokenized_tables_train_as_their_text(tmp_path):
    pandas = pytest.importorskip("pandas")
    datasets = pytest.importorskip("datasets")
    text = read_glue("train.csv")
    ids = tokenized(text)
    assert max(len(r) for r in ids["input_ids"]) <= 32  # no truncation on either side
    _, expected = losses_of(tmp_path, "text", text)
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32")),
                                  "label": datasets.Value("int64")})
    runs = {"columns": ids, "frame": pandas.DataFrame(ids),
            "records": [{"input_ids": i, "label": l} for i, l in zip(ids["input_ids"],
                                                                     ids["label"])],
            "dataset": datasets.Dataset.from_dict(ids, features=features)}
    for name, data in runs.items():
        _, got = losses_of(tmp_path, name, data)
        assert got == expected, name
    assert len(expected) == 12


def test_a_datasets_token_ids_are_read_in_place():
    datasets = pytest.importorskip("datasets")
    ids = tokenized(read_glue("train.csv"))
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32")),
                                  "label": datasets.Value("int64")})
    ds = datasets.Dataset.from_dict(ids, features=features)
    split = tokenized_split(ds)
    column = ds.data.table.column("input_ids").chunk(0)
    arrow_values = column.values.buffers()[1].address
    first = column.offsets[0].as_py()
    assert split["ids"].__array_interface__["data"][0] == arrow_values + 4 * first
    assert split["ids"].tolist() == [i for row in ids["input_ids"] for i in row]
    assert split["labels"].tolist() == ids["label"]
    # A selection of rows (an indices mapping) reads the rows it selects.
    picked = tokenized_split(ds.select([3, 1]))
    assert picked["ids"].tolist() == ids["input_ids"][3] + ids["input_ids"][1]


def test_evaluate_and_predict_on_tokenized_rows_equal_text(tmp_path):
    train, dev = read_glue("train.csv"), read_glue("dev.csv")
    dev["label"] = [i % 2 for i in range(len(dev["label"]))]
    t, _ = losses_of(tmp_path, "run", train, max_steps=4)
    by_text, by_ids = t.evaluate(dev), t.evaluate(tokenized(dev))
    for key in ("eval_loss", "eval_accuracy"):
        assert by_ids[key] == pytest.approx(by_text[key], rel=1e-6), key
    text_predicted = t.predict(dev)
    unlabelled = {"input_ids": tokenized(dev)["input_ids"]}
    predicted = t.predict(unlabelled)
    assert predicted.predictions.tolist() == text_predicted.predictions.tolist()  # the logits
    assert predicted.label_ids is None


def test_a_causal_lm_learns_tokenized_text_as_its_text(tmp_path):
    with open(os.path.join(FIXTURES, "tokenizer", "texts.json")) as f:
        texts = json.load(f) * 6
    config = {"model_type": "gpt2", "vocab_size": 800, "n_embd": 32, "n_layer": 2, "n_head": 2,
              "n_positions": 40, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    runs = {}
    # A text file trains on the rows after run_clm's validation split (5%: 18 of 360 rows); a
    # tokenized dataset is a training set as it is.
    ids = brisk.tokenize(BPE, texts[18:])
    for name, data in [("text", texts), ("ids", {"input_ids": ids}),
                       ("ids_and_labels", {"input_ids": ids, "labels": ids})]:
        args = brisk.TrainingArguments(output_dir=str(tmp_path / name), block_size=32,
                                       max_steps=4, logging_steps=1, disable_tqdm=True)
        t = brisk.Trainer(model=config, args=args, train_dataset=data, tokenizer=BPE)
        t.train()
        runs[name] = [(r["step"], r["loss"]) for r in t.state.log_history if "loss" in r]
    assert len(runs["text"]) == 4
    assert runs["ids"] == runs["text"] and runs["ids_and_labels"] == runs["text"]
    bad = {"input_ids": ids, "labels": [row[::-1] for row in ids]}
    with pytest.raises(ValueError, match="per-token labels other than the inputs"):
        brisk.Trainer(model=config, args=args, train_dataset=bad).train()


@pytest.mark.parametrize("change, message", [
    (lambda d: d["label"].__setitem__(0, 5), "the training set's tokenized rows hold a label "
                                             "outside the classes"),
    (lambda d: d["input_ids"][0].__setitem__(1, 1200), "a token id outside the vocabulary"),
    (lambda d: d["input_ids"].__setitem__(0, list(range(2, 50))), "holds 48 tokens, more than 32"),
])
def test_bad_tokenized_rows_raise_the_engines_message(tmp_path, change, message):
    data = tokenized(read_glue("train.csv"))
    change(data)
    with pytest.raises(brisk.BriskError, match=message):
        losses_of(tmp_path, "bad", data)


def test_padded_or_mixed_data_is_refused(tmp_path):
    data = tokenized(read_glue("train.csv"))
    padded = dict(data, attention_mask=[[1] * (len(r) - 1) + [0] for r in data["input_ids"]])
    with pytest.raises(ValueError, match="padded rows"):
        losses_of(tmp_path, "padded", padded)
    named = dict(data, label=["good" if l else "bad" for l in data["label"]])
    with pytest.raises(ValueError, match="train_dataset row 0, column label: 'good' is not a number"):
        losses_of(tmp_path, "named", named)
    with pytest.raises(ValueError, match="all as text or all tokenized"):
        losses_of(tmp_path, "mixed", data, read_glue("dev.csv"))


def test_the_engine_takes_no_array_it_would_have_to_convert(tmp_path):
    """Arrays of another dtype are refused, never viewed through a temporary copy."""
    split = tokenized_split(tokenized(read_glue("train.csv")))
    options = json.dumps({"model_name_or_path": "bert-tiny", "output_dir": str(tmp_path)})
    for name, wrong in (("ids", np.int64), ("offsets", np.int32), ("labels", np.float32)):
        bad = dict(split, **{name: split[name].astype(wrong)})
        with pytest.raises((TypeError, RuntimeError)):
            brisk._brisk.estimate(options, {"train": bad})




_BAD_ROWS = [  # (column, its row 2, the message after "train_dataset row 2")
    ("input_ids", [101, 5.7, 102], ", column input_ids: 5.7 is not a whole number"),
    ("input_ids", None, ", column input_ids is missing (None)"),
    ("input_ids", [101, [7, 8], 102], ", column input_ids: [7, 8] is not a number"),
    ("input_ids", [101, "7", 102], ", column input_ids: '7' is not a number"),
    ("input_ids", [101, True, 102], ", column input_ids: True is a bool, not a number"),
    ("input_ids", np.array([101, 2**63, 102], dtype=np.uint64),
     ", column input_ids: 9223372036854775808 is outside int32"),
    ("input_ids", [101, 2**70, 102], ", column input_ids: 1180591620717411303424 is outside "
                                     "int32"),
    ("input_ids", "101 7 102", ", column input_ids: '101 7 102' is not a list of numbers"),
    ("token_type_ids", [0, float("nan"), 0], ", column token_type_ids is missing (nan)"),
    ("attention_mask", [1, 1], ": attention_mask and input_ids differ in length"),
]


def test_tokenized_rows_are_checked_naming_column_and_row(tmp_path):
    """One check of every kind of table's rows, Arrow's included: each a list of whole numbers
    (whole floats too) in int32 range; the first bad one named by dataset, row and column."""
    pandas = pytest.importorskip("pandas")
    datasets = pytest.importorskip("datasets")
    pyarrow = pytest.importorskip("pyarrow")
    for column, row, message in _BAD_ROWS:
        columns = {"input_ids": [[101, 7, 102]] * 4, "token_type_ids": [[0, 0, 0]] * 4,
                   "attention_mask": [[1, 1, 1]] * 4, "label": [0, 1, 0, 1]}
        columns[column] = columns[column][:2] + [row] + columns[column][3:]
        records = [dict(zip(columns, values)) for values in zip(*columns.values())]
        for table in (columns, records, pandas.DataFrame(columns)):
            with pytest.raises(ValueError, match=re.escape("train_dataset row 2" + message)):
                tokenized_split(table, "train_dataset")
        try:
            arrow = datasets.Dataset.from_dict(columns)
        except (pyarrow.lib.ArrowException, OverflowError):  # a row Arrow cannot type
            continue
        with pytest.raises(ValueError, match=r"train_dataset row 2\b.*" + column):
            tokenized_split(arrow, "train_dataset")
    nested = datasets.Dataset.from_dict({"input_ids": [[[1]], [[2], [3]]]})
    with pytest.raises(ValueError, match=r"row 0, column input_ids: .* is not a number"):
        tokenized_split(nested)
    holes = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3, None]]})
    with pytest.raises(ValueError, match=r"row 1, column input_ids is missing"):
        tokenized_split(holes)
    for whole in (datasets.Dataset.from_dict({"input_ids": [[1.0, 2.0], [3.0]]}),
                  {"input_ids": [[1.0, 2.0], [np.float32(3)]]}):
        assert tokenized_split(whole)["ids"].tolist() == [1, 2, 3]
    args = brisk.TrainingArguments(output_dir=str(tmp_path), max_steps=1)
    with pytest.raises(ValueError, match=re.escape("eval_dataset row 0, column input_ids: 5.5 is "
                                                   "not a whole number")):
        brisk.Trainer(model="bert-tiny", args=args).evaluate({"input_ids": [[101, 5.5]]})
