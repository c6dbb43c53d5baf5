"""TrainingArguments, refusals, tokenize and generate; the module imports without torch."""

import glob
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import brisk
from conftest import FIXTURES, TINY_BERT, WORDPIECE, read_glue


def test_imports_without_torch():
    code = "import sys, brisk; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_training_arguments_have_the_programs_names_and_defaults():
    args = brisk.TrainingArguments(output_dir="out", learning_rate=3e-5, warmup_ratio=0.1)
    assert (args.output_dir, args.learning_rate, args.warmup_ratio) == ("out", 3e-5, 0.1)
    assert args.per_device_train_batch_size == 8 and args.lr_scheduler_type == "linear"
    assert brisk.TrainingArguments().output_dir == "trainer_output"
    assert args.replace(learning_rate=1e-4).learning_rate == 1e-4
    # An older spelling and a key without effect in brisk.
    args = brisk.TrainingArguments(evaluation_strategy="epoch", push_to_hub=False)
    assert args.eval_strategy == "epoch" and args.ignored_keys == ["push_to_hub"]


@pytest.mark.parametrize("kwargs, message", [
    ({"learnig_rate": 1e-3}, 'unknown option "learnig_rate" (did you mean "learning_rate"?)'),
    ({"fp16": True, "bf16": True}, "--fp16 and --bf16 contradict each other"),
    ({"per_device_train_batch_size": 0}, "per_device_train_batch_size must be positive"),
    ({"push_to_hub": True}, "push_to_hub"),
])
def test_bad_arguments_raise_the_engines_message(kwargs, message):
    with pytest.raises(brisk.BriskError) as caught:
        brisk.TrainingArguments(**kwargs)
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_a_transformers_training_arguments_is_accepted(tmp_path):
    transformers = pytest.importorskip("transformers")
    theirs = transformers.TrainingArguments(output_dir=str(tmp_path), learning_rate=2e-5,
                                            per_device_train_batch_size=4, num_train_epochs=2,
                                            eval_strategy="epoch", weight_decay=0.01)
    for given in (theirs, theirs.to_dict()):
        ours = brisk.Trainer(model="bert-tiny", args=given).args
        assert (ours.learning_rate, ours.per_device_train_batch_size, ours.num_train_epochs,
                ours.eval_strategy, ours.weight_decay) == (2e-5, 4, 2, "epoch", 0.01)
        assert ours.output_dir == str(tmp_path)


_ARGS_FILES = sorted(glob.glob(os.path.join(FIXTURES, "trainer_args", "*.json")))


class _TheirArguments:
    """Stands in for a transformers TrainingArguments (or TRL's SFTConfig): an object with
    to_dict()."""

    def __init__(self, values):
        self._values = values

    def to_dict(self):
        return dict(self._values)


@pytest.mark.parametrize("path", _ARGS_FILES, ids=os.path.basename)
def test_every_training_arguments_file_reads_as_keywords_dict_and_object(path):
    """TrainingArguments of transformers 4.46 through 5.x, with accelerate and without, as
    to_json_string() wrote them: by keywords, as a dict, as an object, positional or args=."""
    with open(path) as f:
        values = json.load(f)
    for made in (lambda: brisk.TrainingArguments(**values),
                 lambda: brisk.TrainingArguments(values),
                 lambda: brisk.TrainingArguments(_TheirArguments(values)),
                 lambda: brisk.TrainingArguments.of(_TheirArguments(values)),
                 lambda: brisk.Trainer(model="bert-tiny", args=values).args):
        args = made()
        assert args.learning_rate == values["learning_rate"]
        assert args.per_device_train_batch_size == values["per_device_train_batch_size"]
        assert args.output_dir == values["output_dir"]
    assert len(_ARGS_FILES) >= 12


def test_a_positional_training_arguments_is_read_never_ignored(tmp_path):
    theirs = _TheirArguments({"output_dir": str(tmp_path), "learning_rate": 0.002})
    assert brisk.TrainingArguments(theirs).learning_rate == 0.002
    assert brisk.TrainingArguments(theirs, learning_rate=0.1).learning_rate == 0.1
    ours = brisk.TrainingArguments(str(tmp_path), learning_rate=0.003)
    assert brisk.TrainingArguments(ours).learning_rate == 0.003
    assert ours.replace(seed=3).learning_rate == 0.003
    assert brisk.TrainingArguments(tmp_path).output_dir == str(tmp_path)  # a PathLike
    with pytest.raises(TypeError, match="output_dir must be a path, a TrainingArguments or a "
                                        "dict, not int"):
        brisk.TrainingArguments(3)

    class Odd:
        def to_dict(self):
            return [1]

    with pytest.raises(TypeError, match="Odd.to_dict\\(\\) returned list, not a dict"):
        brisk.TrainingArguments(Odd())


def test_a_real_transformers_training_arguments_positional(tmp_path):
    transformers = pytest.importorskip("transformers")
    theirs = transformers.TrainingArguments(output_dir=str(tmp_path), learning_rate=0.002)
    for made in (brisk.TrainingArguments(theirs), brisk.TrainingArguments(**theirs.to_dict()),
                 brisk.TrainingArguments.of(theirs)):
        assert made.learning_rate == 0.002 and made.output_dir == str(tmp_path)


def test_bad_inputs_raise_one_message(tmp_path):
    args = brisk.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=1)
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(brisk.BriskError, match="no-such-model"):
        brisk.Trainer(model=missing, args=args, train_dataset=read_glue("train.csv"),
                      tokenizer=WORDPIECE).train()
    bad = tmp_path / "bad.json"
    bad.write_text('{"model_type": "bert", "vocab_size": -4}')
    with pytest.raises(brisk.BriskError, match="vocab_size"):
        brisk.Trainer(model=str(bad), args=args, train_dataset=read_glue("train.csv"),
                      tokenizer=WORDPIECE).train()
    # A metric of compute_metrics' may be metric_for_best_model; without one, brisk's only.
    custom = args.replace(metric_for_best_model="my_accuracy")
    with pytest.raises(brisk.BriskError, match="is none of brisk's metrics"):
        brisk.Trainer(model="bert-tiny", args=custom, train_dataset=read_glue("train.csv")).train()
    datasets = pytest.importorskip("datasets")
    stream = datasets.IterableDataset.from_generator(lambda: iter([{"sentence": "a", "label": 0}]))
    with pytest.raises(TypeError, match="a streaming datasets.IterableDataset"):
        brisk.Trainer(model="bert-tiny", args=args, train_dataset=stream).train()
    with pytest.raises(TypeError, match="a dataset is"):
        brisk.Trainer(model="bert-tiny", args=args, train_dataset=42).train()
    with pytest.raises(ValueError, match="columns of different lengths"):
        brisk.Trainer(model="bert-tiny", args=args,
                      train_dataset={"sentence": ["a", "b"], "label": [0]}).train()


def test_non_finite_numbers_never_reach_the_engine(tmp_path):
    """A NaN or an infinity is refused naming its option, config key, or dataset row and column,
    never written as JSON's NaN literal the engine cannot parse."""
    nan, inf = float("nan"), float("inf")
    for kwargs, message in [({"learning_rate": nan}, "learning_rate must be a finite number, "
                                                      "got nan"),
                            ({"num_train_epochs": np.float32(inf)}, "num_train_epochs must be a "
                                                                     "finite number, got inf"),
                            ({"lr_scheduler_kwargs": {"min_lr": -inf}},
                             "lr_scheduler_kwargs['min_lr'] must be a finite number, got -inf")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            brisk.TrainingArguments(**kwargs)
    args = brisk.TrainingArguments(output_dir=str(tmp_path), max_steps=1)
    with pytest.raises(ValueError, match=re.escape("model['layer_norm_eps'] must be a finite")):
        brisk.Trainer(model=dict(TINY_BERT, layer_norm_eps=nan), args=args)
    train = read_glue("train.csv")
    train["label"][2] = nan
    with pytest.raises(ValueError, match="train_dataset row 2, column label must be a finite "
                                         "number, got nan"):
        brisk.Trainer(model="bert-tiny", args=args, train_dataset=train).train()
    records = [{"sentence": "a", "label": 0}, {"sentence": "b", "label": np.float64(inf)}]
    with pytest.raises(ValueError, match="eval_dataset row 1, column label must be a finite "
                                         "number, got inf"):
        brisk.Trainer(model="bert-tiny", args=args).evaluate(records)
    # DataFrames and Datasets, whose own JSON writers write NaN and infinity as null.
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame({"sentence": ["a", "b", "c"], "label": [0.5, nan, 1.5]})
    with pytest.raises(ValueError, match="train_dataset row 1, column label must be a finite "
                                         "number, got nan"):
        brisk.Trainer(model="bert-tiny", args=args, train_dataset=frame).train()
    frame["label"] = [0.5, 1.0, -inf]
    with pytest.raises(ValueError, match="eval_dataset row 2, column label must be a finite "
                                         "number, got -inf"):
        brisk.Trainer(model="bert-tiny", args=args).evaluate(frame)
    datasets = pytest.importorskip("datasets")
    table = datasets.Dataset.from_dict({"sentence": ["a", "b"], "label": [inf, 1.0]})
    with pytest.raises(ValueError, match="train_dataset row 0, column label must be a finite "
                                         "number, got inf"):
        brisk.Trainer(model="bert-tiny", args=args, train_dataset=table).train()
    with pytest.raises(ValueError, match="temperature must be a finite number, got nan"):
        brisk.generate(str(tmp_path), "a prompt", temperature=nan)
    assert not os.path.exists(tmp_path / "brisk_inputs" / "eval.jsonl")


def test_arguments_are_checked_naming_them(tmp_path):
    """Each argument converted for the engine is checked first: TypeError for a wrong type,
    ValueError for a bad value, either naming the argument."""
    model = os.path.join(FIXTURES, "bert_tiny")
    args = brisk.TrainingArguments(output_dir=str(tmp_path), max_steps=1)
    trainer = brisk.Trainer(model="bert-tiny", args=args, train_dataset=read_glue("train.csv"))
    for call, error, message in [
            (lambda: brisk.generate(model, "a", device=1), TypeError,
             "device must be a str, not int"),
            (lambda: brisk.generate(model, "a", max_new_tokens="x"), TypeError,
             "max_new_tokens must be a whole number (an int), not str"),
            (lambda: brisk.generate(model, "a", top_k=True), TypeError,
             "top_k must be a whole number (an int), not bool"),
            (lambda: brisk.generate(model, "a", max_new_tokens=2.5), TypeError,
             "max_new_tokens must be a whole number (an int), not float"),
            (lambda: brisk.generate(model, "a", do_sample="yes"), TypeError,
             "do_sample must be True or False, not str"),
            (lambda: brisk.generate(model, 3), TypeError, "prompt must be a str, not int"),
            (lambda: brisk.generate(None, "a"), TypeError,
             "model must be a path (a str or os.PathLike), not NoneType"),
            (lambda: brisk.tokenize(WORDPIECE, None), TypeError,
             "texts must be a str or a list of str, not NoneType"),
            (lambda: brisk.tokenize(WORDPIECE, [1, 2]), TypeError,
             "texts[0] must be a str, not int"),
            (lambda: brisk.tokenize(WORDPIECE, "a", add_special_tokens=None), TypeError,
             "add_special_tokens must be True or False, not NoneType"),
            (lambda: brisk.tokenize(3, "a"), TypeError, "tokenizer must be a path"),
            (lambda: trainer.train(resume_from_checkpoint=3), TypeError,
             "resume_from_checkpoint must be a checkpoint folder, True (the last) or None, "
             "not int"),
            (lambda: trainer.estimate_memory(world_size="2"), TypeError,
             "world_size must be a whole number (an int), not str"),
            (lambda: trainer.estimate_memory(world_size=0), ValueError,
             "world_size must be a whole number from 1 to 1048576, got 0"),
            (lambda: trainer.predict(None), ValueError, "Trainer.predict() needs a test_dataset"),
            (lambda: trainer.save_model(3), TypeError, "output_dir must be a path"),
            (lambda: brisk.TrainingArguments.from_dict(5), TypeError,
             "TrainingArguments.from_dict takes a dict, not int")]:
        with pytest.raises(error, match=re.escape(message)):
            call()
    assert brisk.tokenize(WORDPIECE, ("a", np.str_("b"))) == brisk.tokenize(WORDPIECE, ["a", "b"])
    assert not os.path.exists(tmp_path / "brisk_inputs")  # refused before any file was written


def test_empty_datasets_and_missing_labels_are_named(tmp_path):
    """A table without rows is called empty, naming its role; a tokenized table's missing label
    (None, NaN, pandas' NA) is refused naming its row, never read as no label or a real."""
    pandas = pytest.importorskip("pandas")
    datasets = pytest.importorskip("datasets")
    args = brisk.TrainingArguments(output_dir=str(tmp_path), max_steps=1)
    trainer = brisk.Trainer(model="bert-tiny", args=args)
    for empty in ([], {}, {"sentence": [], "label": []}, {"input_ids": []},
                  pandas.DataFrame({"sentence": [], "label": []}),
                  datasets.Dataset.from_dict({"sentence": [], "label": []}),
                  datasets.DatasetDict({"train": datasets.Dataset.from_dict({"input_ids": []})})):
        for call, name in ((lambda: brisk.Trainer(model="bert-tiny", args=args,
                                                  train_dataset=empty).train(), "train_dataset"),
                           (lambda: trainer.evaluate(empty), "eval_dataset"),
                           (lambda: trainer.predict(empty), "test_dataset")):
            with pytest.raises(ValueError, match="^%s is empty$" % name):
                call()
    ids = brisk.tokenize(WORDPIECE, read_glue("train.csv")["sentence"][:4])
    for labels in ([0.5, float("nan"), 1.5, 2.0], [0, None, 1, 0],
                   pandas.array([0, None, 1, 0], dtype="Int64")):
        for table in ({"input_ids": ids, "label": labels},
                      pandas.DataFrame({"input_ids": ids, "label": labels})):
            with pytest.raises(ValueError, match=re.escape(
                    "eval_dataset row 1, column label is missing (")):
                trainer.evaluate(table)
    arrow = datasets.Dataset.from_dict({"input_ids": ids, "label": [0, None, 1, 0]})
    with pytest.raises(ValueError, match=re.escape("test_dataset row 1, column label is missing")):
        trainer.predict(arrow)


def test_tokenize_equals_the_program(program):
    with open(os.path.join(FIXTURES, "tokenizer", "texts.json")) as f:
        texts = json.load(f)
    texts = [t for t in texts if "\n" not in t and "\r" not in t]  # the program reads lines
    done = subprocess.run([program, "tokenize", "--tokenizer", WORDPIECE],
                          input="\n".join(texts) + "\n", capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    expected = [json.loads(line) for line in done.stdout.splitlines()]
    assert brisk.tokenize(WORDPIECE, texts) == expected
    assert brisk.tokenize(WORDPIECE, texts[0]) == expected[0]
    with pytest.raises(brisk.BriskError):
        brisk.tokenize(os.path.join(FIXTURES, "no-such-tokenizer"), ["text"])


def test_generate_equals_the_program(tmp_path, program):
    """A tiny GPT-2 trained through the API on a list of texts, then continued by both."""
    with open(os.path.join(FIXTURES, "tokenizer", "texts.json")) as f:
        texts = json.load(f) * 6
    config = {"model_type": "gpt2", "vocab_size": 800, "n_embd": 32, "n_layer": 2, "n_head": 2,
              "n_positions": 40, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    folder = str(tmp_path / "lm")
    args = brisk.TrainingArguments(output_dir=folder, block_size=32, max_steps=5,
                                   disable_tqdm=True)
    brisk.Trainer(model=config, args=args, train_dataset=texts,
                  tokenizer=os.path.join(FIXTURES, "tokenizer", "bpe")).train()
    prompt = "The quick brown fox"
    out = brisk.generate(folder, prompt, max_new_tokens=12, device="cpu")
    done = subprocess.run([program, "generate", "--model", folder, "--prompt", prompt,
                           "--max_new_tokens", "12", "--device", "cpu"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert out["text"] == done.stdout.rstrip("\n") and out["text"].startswith(prompt)
    assert len(out["new_ids"]) == 12 and out["planned_bytes"] > 0
    with pytest.raises(brisk.BriskError, match="no tokenizer"):
        brisk.generate(os.path.join(FIXTURES, "bert_tiny"), prompt)
    with pytest.raises(ValueError, match="seed must be a whole number"):
        brisk.generate(folder, prompt, seed=-1)
    # With a LoRA adapter trained on the folder: as the program generates with it.
    adapter = str(tmp_path / "lora")
    args = brisk.TrainingArguments(output_dir=adapter, block_size=32, max_steps=3,
                                   learning_rate=0.05, disable_tqdm=True)
    brisk.Trainer(model=folder, args=args, train_dataset=texts,
                  peft_config={"r": 4, "target_modules": ["c_attn"]}).train()
    adapted = brisk.generate(folder, prompt, max_new_tokens=12, device="cpu",
                             adapter_name_or_path=adapter)
    done = subprocess.run([program, "generate", "--model", folder, "--prompt", prompt,
                           "--max_new_tokens", "12", "--device", "cpu",
                           "--adapter_name_or_path", adapter], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert adapted["text"] == done.stdout.rstrip("\n") and adapted["new_ids"] != out["new_ids"]


def test_a_process_of_a_launch_is_refused(tmp_path):
    """Runs of several processes stay with the program under a launcher."""
    code = ("import brisk\n"
            "args = brisk.TrainingArguments(output_dir=%r, max_steps=1)\n"
            "try:\n"
            "    brisk.Trainer(model='bert-tiny', args=args).estimate_memory()\n"
            "    brisk.Trainer(model='bert-tiny', args=args, train_dataset=%r).train()\n"
            "except brisk.BriskError as e:\n"
            "    print(e)\n" % (str(tmp_path), os.path.join(FIXTURES, "glue_pandas", "train.csv")))
    env = dict(os.environ, RANK="1", WORLD_SIZE="2", LOCAL_RANK="1")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert "this process is rank 1 of 2: the Python API runs one process" in done.stdout


@pytest.mark.skipif(not os.environ.get("BRISK_WHEEL_INSTALLED"),
                    reason="the package was not installed from scripts/wheel.sh's wheel")
def test_the_wheel_carries_the_libraries_it_links():
    module = brisk._brisk.__file__
    done = subprocess.run(["ldd", module], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    resolved = dict(line.split(" => ", 1) for line in done.stdout.splitlines() if " => " in line)
    libraries = {name.strip(): path for name, path in resolved.items()}
    for lib in ("dnnl", "openblas", "pcre2-8", "utf8proc", "sentencepiece", "xxhash"):
        found = [path for name, path in libraries.items() if name.startswith("lib" + lib)]
        assert found and "brisk.libs" in found[0], (lib, found, done.stdout)
