"""brisk.Trainer against the brisk program on the same inputs."""

import json
import os
import re
import signal

import numpy as np
import pytest

import brisk
from conftest import FIXTURES, RUN, TINY_BERT, WORDPIECE, losses, read_glue, run_cli, write_csv


def trainer(tmp_path, config, train, eval_data=None, callbacks=None, **changes):
    options = dict(RUN, **changes)
    args = brisk.TrainingArguments(output_dir=str(tmp_path / "api"), **options)
    return brisk.Trainer(model=config, args=args, train_dataset=train, eval_dataset=eval_data,
                         tokenizer=WORDPIECE, callbacks=callbacks)


def cli_options(tmp_path, config, train_csv, **extra):
    return dict(RUN, model_name_or_path=config, tokenizer_name=WORDPIECE, train_file=train_csv,
                output_dir=str(tmp_path / "cli"), **extra)


def api_losses(t):
    return [(r["step"], r["loss"]) for r in t.state.log_history if "loss" in r]


def test_train_equals_the_program(tmp_path, program, bert_config):
    train = read_glue("train.csv")
    t = trainer(tmp_path, bert_config, train)
    out = t.train()
    cli = run_cli(program, "train", cli_options(tmp_path, bert_config,
                                                write_csv(train, tmp_path / "train.csv")))
    assert len(api_losses(t)) == out.global_step == 12  # 24 rows, batch 4, 2 epochs
    assert [s for s, _ in api_losses(t)] == [s for s, _ in losses(cli)]
    assert [v for _, v in api_losses(t)] == pytest.approx([v for _, v in losses(cli)], rel=1e-6)
    with open(tmp_path / "cli" / "train_results.json") as f:
        assert out.training_loss == pytest.approx(json.load(f)["train_loss"], rel=1e-6)
    assert set(out.metrics) >= {"train_runtime", "train_samples_per_second", "train_loss"}
    assert t.state.global_step == 12 and t.state.log_history[-1]["train_loss"] > 0
    assert os.path.isfile(tmp_path / "api" / "model.safetensors")


def test_padding_free_trains_as_the_padded_batches(tmp_path, bert_config):
    train = read_glue("train.csv")
    padded = trainer(tmp_path / "padded", bert_config, train, max_steps=4)
    padded.train()
    free = trainer(tmp_path / "free", bert_config, train, max_steps=4, padding_free=True)
    assert free.args.padding_free is True
    free.train()
    assert len(api_losses(free)) == 4
    assert [v for _, v in api_losses(free)] == pytest.approx(
        [v for _, v in api_losses(padded)], rel=2e-5)
    with pytest.raises(brisk.BriskError, match="contradict each other"):
        brisk.TrainingArguments(padding_free=True, pad_to_max_length=True)


def test_prompt_completion_rows_train_as_torch_packed_or_not(tmp_path, program):
    """A causal LM on prompt/completion columns: the loss on the completions, as plain torch on
    each row alone (tests/fixtures/sft); packed, as the program packs the same file."""
    sft = os.path.join(FIXTURES, "sft")
    with open(os.path.join(sft, "expected.json")) as f:
        expected = json.load(f)
    want = expected["runs"]["gpt2/pairs"]
    with open(os.path.join(sft, "pairs.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    pairs = {"prompt": [r["prompt"] for r in rows], "completion": [r["completion"] for r in rows]}
    options = dict(block_size=expected["block_size"], max_steps=expected["steps"],
                   per_device_train_batch_size=len(want["samples"]), optim="sgd",
                   learning_rate=expected["learning_rate"], lr_scheduler_type="constant",
                   weight_decay=0.0, max_grad_norm=0.0, logging_steps=1, save_strategy="no",
                   disable_tqdm=True, report_to="none")
    tokenizer = os.path.join(FIXTURES, "tokenizer", "bpe")

    def api(name, **changes):
        args = brisk.TrainingArguments(output_dir=str(tmp_path / name), **dict(options, **changes))
        t = brisk.Trainer(model=os.path.join(sft, "gpt2"), args=args, train_dataset=pairs,
                          tokenizer=tokenizer)
        t.train()
        return [v for _, v in api_losses(t)]

    assert api("rows") == pytest.approx(want["losses"], rel=2e-5)
    packed = api("packed", packing=True, per_device_train_batch_size=2, max_steps=4)
    cli = run_cli(program, "train", dict(options, model_name_or_path=os.path.join(sft, "gpt2"),
                                         tokenizer_name=tokenizer,
                                         train_file=os.path.join(sft, "pairs.jsonl"),
                                         output_dir=str(tmp_path / "cli"), packing=True,
                                         per_device_train_batch_size=2, max_steps=4))
    assert len(packed) == 4
    assert packed == pytest.approx([v for _, v in losses(cli)], rel=1e-6)
    with pytest.raises(brisk.BriskError, match="meaningless with --packing"):
        brisk.TrainingArguments(packing=True, group_by_length=True)


def test_datasets_and_dataframes_train_alike(tmp_path, bert_config):
    pandas = pytest.importorskip("pandas")
    datasets = pytest.importorskip("datasets")
    columns = read_glue("train.csv")
    frame = pandas.DataFrame(columns)
    records = [{"sentence": s, "label": l} for s, l in zip(columns["sentence"], columns["label"])]
    runs = {}
    for name, data in [("columns", columns), ("records", records), ("frame", frame),
                       ("dataset", datasets.Dataset.from_pandas(frame)),
                       ("dataset_dict", datasets.DatasetDict(
                           {"train": datasets.Dataset.from_pandas(frame)}))]:
        t = trainer(tmp_path / name, bert_config, data, max_steps=4)
        t.train()
        runs[name] = api_losses(t)
    assert len(runs["columns"]) == 4
    for name, got in runs.items():
        assert got == runs["columns"], name


def test_evaluate_and_predict_equal_the_program(tmp_path, program, bert_config):
    train, dev = read_glue("train.csv"), read_glue("dev.csv")
    dev["label"] = [i % 2 for i in range(len(dev["label"]))]  # GLUE's withheld -1s, labelled
    t = trainer(tmp_path, bert_config, train, dev, max_steps=5, eval_strategy="steps",
                eval_steps=5)
    t.train()
    metrics = t.evaluate()
    predicted = t.predict(dev)
    dev_csv = write_csv(dev, tmp_path / "dev.csv")
    run_cli(program, "train", cli_options(tmp_path, bert_config,
                                          write_csv(train, tmp_path / "train.csv"),
                                          validation_file=dev_csv, test_file=dev_csv,
                                          max_steps=5, do_eval=True, do_predict=True))
    with open(tmp_path / "cli" / "eval_results.json") as f:
        cli_metrics = json.load(f)
    for key in ("eval_loss", "eval_accuracy", "eval_f1", "epoch"):
        assert metrics[key] == pytest.approx(cli_metrics[key], rel=1e-6), key
    with open(tmp_path / "cli" / "predict_results.txt") as f:
        cli_predicted = [int(line.split("\t")[1]) for line in f.read().splitlines()[1:]]
    assert predicted.predictions.shape == (len(dev["label"]), 2)
    classes = predicted.predictions.argmax(-1)
    assert classes.tolist() == cli_predicted
    assert predicted.label_ids.tolist() == dev["label"]
    assert predicted.metrics["predict_accuracy"] == pytest.approx(
        np.mean(classes == predicted.label_ids))


def test_save_model_writes_a_model_folder(tmp_path, bert_config):
    t = trainer(tmp_path, bert_config, read_glue("train.csv"), max_steps=2)
    t.train()
    t.save_model(tmp_path / "saved")
    names = set(os.listdir(tmp_path / "saved"))
    assert {"config.json", "model.safetensors", "vocab.txt"} <= names
    assert not any(n.startswith("checkpoint-") or n == "brisk_inputs" for n in names)
    again = brisk.Trainer(model=str(tmp_path / "saved"),
                          args=brisk.TrainingArguments(output_dir=str(tmp_path / "again"), **RUN))
    assert again.evaluate(read_glue("train.csv"))["eval_loss"] == pytest.approx(
        t.evaluate(read_glue("train.csv"))["eval_loss"], rel=1e-6)


def test_estimate_memory_equals_the_program(tmp_path, program, bert_config):
    train, dev = read_glue("train.csv"), read_glue("dev.csv")
    t = trainer(tmp_path, bert_config, train, dev, per_device_train_batch_size=8, bf16=True,
                eval_strategy="epoch")
    plan = t.estimate_memory()
    json_path = tmp_path / "plan.json"
    run_cli(program, "estimate",
            cli_options(tmp_path, bert_config, write_csv(train, tmp_path / "train.csv"),
                        validation_file=write_csv(dev, tmp_path / "dev.csv"),
                        per_device_train_batch_size=8, bf16=True, eval_strategy="epoch"),
            "--output_json", str(json_path))
    with open(json_path) as f:
        cli_plan = json.load(f)
    assert plan["memory"]["planned_bytes"] == cli_plan["memory"]["planned_bytes"]
    assert plan["memory"]["planned_total_bytes"] > 0
    # All but the host's baseline: what this process (a Python interpreter) holds already.
    for ours in (plan, cli_plan):
        assert ours["memory"].pop("host_baseline_bytes") > 0
    assert plan == cli_plan


class Recorder(brisk.TrainerCallback):
    def __init__(self):
        self.events = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.events.append(("train_begin",))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "loss" in logs:
            self.events.append(("log", logs["step"]))

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.events.append(("evaluate", metrics["step"]))

    def on_save(self, args, state, control, checkpoint=None, **kwargs):
        self.events.append(("save", os.path.basename(checkpoint)))

    def on_epoch_end(self, args, state, control, **kwargs):
        self.events.append(("epoch_end", state.global_step))

    def on_train_end(self, args, state, control, **kwargs):
        self.events.append(("train_end", state.global_step))


def test_callbacks_see_the_events_in_order(tmp_path, bert_config):
    recorder = Recorder()
    t = trainer(tmp_path, bert_config, read_glue("train.csv"), read_glue("train.csv"),
                callbacks=[recorder], eval_strategy="epoch", save_strategy="epoch")
    t.train()
    expected = [("train_begin",)]
    for epoch in (1, 2):
        expected += [("log", s) for s in range(6 * epoch - 5, 6 * epoch + 1)]
        expected += [("evaluate", 6 * epoch), ("save", "checkpoint-%d" % (6 * epoch)),
                     ("epoch_end", 6 * epoch)]
    assert recorder.events == expected + [("train_end", 12)]


class StopAt(brisk.TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs.get("step") == self.step:
            control.should_training_stop = True


def test_a_callback_stops_the_training(tmp_path, bert_config):
    t = trainer(tmp_path, bert_config, read_glue("train.csv"), callbacks=[StopAt(3)])
    out = t.train()
    assert out.global_step == 3
    with open(tmp_path / "api" / "trainer_state.json") as f:
        assert json.load(f)["global_step"] == 3


class Interrupt(brisk.TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs.get("step") == 2:
            os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C in a notebook


def test_ctrl_c_stops_at_a_step_boundary(tmp_path, bert_config):
    t = trainer(tmp_path, bert_config, read_glue("train.csv"), callbacks=[Interrupt()])
    # Python's own Ctrl-C handler, as a notebook or terminal has it (a shell's background job
    # starts with SIGINT ignored, and Python then keeps it so).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            t.train()
    finally:
        signal.signal(signal.SIGINT, previous)
    with open(tmp_path / "api" / "trainer_state.json") as f:
        assert json.load(f)["global_step"] == 2  # the step under way finished, then saved
    assert t.state.global_step == 2  # and the Trainer goes on from that model
    assert t.evaluate(read_glue("train.csv"))["eval_loss"] > 0
    assert os.path.isfile(tmp_path / "api" / "model.safetensors")


class StepEnds(brisk.TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append((state.global_step, state.max_steps))


def test_steps_show_as_a_progress_bar_and_step_ends(tmp_path, bert_config, capsys):
    pytest.importorskip("tqdm")
    ends = StepEnds()
    args = brisk.TrainingArguments(output_dir=str(tmp_path / "api"),
                                   **dict(RUN, disable_tqdm=False))
    t = brisk.Trainer(model=bert_config, args=args, train_dataset=read_glue("train.csv"),
                      tokenizer=WORDPIECE, callbacks=[ends])
    t.train()
    assert ends.steps == [(s, 12) for s in range(1, 13)]
    shown = capsys.readouterr()
    assert "12/12" in shown.err  # tqdm's bar, not the engine's
    records = [json.loads(line) for line in shown.out.splitlines() if line.startswith("{")]
    assert [r["step"] for r in records if "loss" in r] == list(range(1, 13))  # above the bar
    table = t.memory_table()
    for line in ("weights", "optimizer_state", "activations", "process peak"):
        assert line in table
    with open(tmp_path / "api" / "train_results.json") as f:
        assert t.memory == json.load(f)["memory"]


def test_compute_metrics_sees_the_logits_and_labels(tmp_path, bert_config):
    seen = []

    def compute_metrics(p):
        seen.append(p)
        return {"my_accuracy": np.mean(p.predictions.argmax(-1) == p.label_ids)}

    train, dev = read_glue("train.csv"), read_glue("dev.csv")
    dev["label"] = [i % 2 for i in range(len(dev["label"]))]
    args = brisk.TrainingArguments(output_dir=str(tmp_path / "api"),
                                   **dict(RUN, eval_strategy="epoch", save_strategy="epoch",
                                          load_best_model_at_end=True,
                                          metric_for_best_model="my_accuracy"))
    t = brisk.Trainer(model=bert_config, args=args, train_dataset=train, eval_dataset=dev,
                      tokenizer=WORDPIECE, compute_metrics=compute_metrics)
    t.train()
    evaluated = [r for r in t.state.log_history if "eval_loss" in r]
    assert len(seen) == len(evaluated) == 2  # each epoch's evaluation inside train()
    for p, record in zip(seen, evaluated):
        assert p.predictions.shape == (len(dev["label"]), 2)
        assert p.label_ids.tolist() == dev["label"]
        assert record["eval_my_accuracy"] == pytest.approx(record["eval_accuracy"])
    assert t.state.best_metric == max(r["eval_my_accuracy"] for r in evaluated)
    metrics = t.evaluate(write_csv(dev, tmp_path / "dev.csv"))  # a file's labels too
    assert len(seen) == 3 and seen[2].label_ids.tolist() == dev["label"]
    assert metrics["eval_my_accuracy"] == pytest.approx(metrics["eval_accuracy"])
    with open(tmp_path / "api" / "eval_results.json") as f:
        assert json.load(f)["eval_my_accuracy"] == metrics["eval_my_accuracy"]
    assert t.predict(dev).predictions.tolist() == seen[2].predictions.tolist()


def test_resuming_from_a_checkpoint_continues_the_run(tmp_path, bert_config):
    whole = trainer(tmp_path / "whole", bert_config, read_glue("train.csv"),
                    save_strategy="steps", save_steps=6)
    whole.train()
    resumed = trainer(tmp_path / "resumed", bert_config, read_glue("train.csv"))
    resumed.train(resume_from_checkpoint=tmp_path / "whole" / "api" / "checkpoint-6")
    # The history carries the checkpoint's steps, as transformers' does.
    assert api_losses(resumed) == api_losses(whole)
    assert [s for s, _ in api_losses(resumed)] == list(range(1, 13))


def test_label_ids_are_the_labels_the_engine_read(tmp_path):
    """predict() and compute_metrics get each row's label as the engine read it: text labels as
    the class ids of the label2id it learned, a regression's numbers as float32."""
    train = read_glue("train.csv")
    names = ["bad", "good"]
    text = {"sentence": train["sentence"], "label": [names[v] for v in train["label"]]}
    seen = []
    config = tmp_path / "classes.json"
    config.write_text(json.dumps(TINY_BERT))
    t = trainer(tmp_path / "text", str(config), text, text, max_steps=2, eval_strategy="steps",
                eval_steps=2)
    t.compute_metrics = lambda p: seen.append(p.label_ids) or {}
    t.train()
    predicted = t.predict(text)
    with open(tmp_path / "text" / "api" / "config.json") as f:
        label2id = json.load(f)["label2id"]
    want = [label2id[n] for n in text["label"]]
    assert predicted.label_ids.dtype == np.int64 and predicted.label_ids.tolist() == want
    assert seen and seen[-1].tolist() == want

    values = {"sentence": train["sentence"], "label": [0.25 + 1.5 * v for v in train["label"]]}
    regression = dict(TINY_BERT, num_labels=1, problem_type="regression")
    for key in ("id2label", "label2id"):
        regression.pop(key, None)
    config = tmp_path / "regression.json"
    config.write_text(json.dumps(regression))
    t = trainer(tmp_path / "numbers", str(config), values, max_steps=2)
    t.train()
    predicted = t.predict(values)
    assert predicted.label_ids.dtype == np.float32
    assert predicted.label_ids.tolist() == values["label"]


class LogIsNoMethod(brisk.TrainerCallback):
    on_log = 3


def test_compute_metrics_results_and_callbacks_are_checked(tmp_path, bert_config):
    """compute_metrics must return a dict of names to finite numbers (NumPy's too); a callback's
    events must be methods, checked when it is added."""
    dev = read_glue("dev.csv")
    dev["label"] = [i % 2 for i in range(len(dev["label"]))]
    t = trainer(tmp_path, bert_config, read_glue("train.csv"))
    t.train()  # evaluate() reads trained weights
    for result, error, message in [
            ([0.5], TypeError, "compute_metrics must return a dict of metric names to numbers, "
                               "not list"),
            (None, TypeError, "compute_metrics must return a dict of metric names to numbers, "
                              "not NoneType"),
            ({1: 0.5}, TypeError, "compute_metrics returned the key 1: metric names are str"),
            ({"score": "high"}, TypeError, "compute_metrics' score must be a number, not str"),
            ({"score": True}, TypeError, "compute_metrics' score must be a number, not bool"),
            ({"score": np.float32("nan")}, ValueError,
             "compute_metrics' score must be a finite number, got nan")]:
        t.compute_metrics = lambda p, result=result: result
        with pytest.raises(error, match=re.escape(message)):
            t.evaluate(dev)
    t.compute_metrics = 5
    with pytest.raises(TypeError, match="compute_metrics must be a function of an EvalPrediction, "
                                        "not int"):
        t.evaluate(dev)
    t.compute_metrics = lambda p: {"a": np.float32(0.5), "b": np.int64(3), "c": np.array(0.25)}
    metrics = t.evaluate(dev)
    assert (metrics["eval_a"], metrics["eval_b"], metrics["eval_c"]) == (0.5, 3, 0.25)

    with pytest.raises(TypeError, match="callback LogIsNoMethod: on_log must be a method, not "
                                        "int"):
        t.add_callback(LogIsNoMethod)
    with pytest.raises(TypeError, match="callback object has none of the events"):
        t.add_callback(object())
    with pytest.raises(TypeError, match="callbacks must be a list of callbacks, not Recorder"):
        trainer(tmp_path, bert_config, read_glue("train.csv"), callbacks=Recorder())


def test_peft_config_trains_an_adapter_as_the_program(tmp_path, program, bert_config):
    train, dev = read_glue("train.csv"), read_glue("dev.csv")
    base = trainer(tmp_path / "base", bert_config, train, max_steps=1)  # a base with weights
    base.train()
    folder = str(tmp_path / "base" / "api")
    lora = {"peft_type": "LORA", "task_type": "SEQ_CLS", "r": 4, "lora_alpha": 8,
            "lora_dropout": 0.0, "target_modules": {"value", "query"}, "use_dora": False}
    args = brisk.TrainingArguments(output_dir=str(tmp_path / "api"), **dict(RUN, max_steps=4))
    t = brisk.Trainer(model=folder, args=args, train_dataset=train, peft_config=lora)
    t.train()
    names = set(os.listdir(tmp_path / "api"))
    assert {"adapter_config.json", "adapter_model.safetensors"} <= names
    assert "model.safetensors" not in names
    cli = run_cli(program, "train", dict(
        RUN, model_name_or_path=folder, train_file=write_csv(train, tmp_path / "train.csv"),
        output_dir=str(tmp_path / "cli"), max_steps=4, use_peft=True, lora_r=4, lora_alpha=8,
        lora_dropout=0.0, lora_target_modules="query,value"))
    assert [v for _, v in api_losses(t)] == pytest.approx([v for _, v in losses(cli)], rel=1e-6)
    adapted = t.evaluate(dev)["eval_loss"]
    alone = brisk.Trainer(model=folder, args=brisk.TrainingArguments(
        output_dir=str(tmp_path / "alone"), **RUN)).evaluate(dev)["eval_loss"]
    assert abs(adapted - alone) > 1e-6
    t.save_model(tmp_path / "saved")
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(
        os.listdir(tmp_path / "saved"))
    with pytest.raises(ValueError, match="use_dora is set"):
        brisk.Trainer(model=folder, args=args, peft_config=dict(lora, use_dora=True))
    with pytest.raises(TypeError, match="peft_config must be"):
        brisk.Trainer(model=folder, args=args, peft_config=7)

def test_peft_config_names_a_mixtures_experts_as_target_parameters():
    from brisk.trainer import _lora_options
    options = _lora_options({"r": 2, "lora_dropout": 0.0, "target_modules": ["q_proj"],
                             "target_parameters": ["mlp.experts.gate_up_proj",
                                                   "mlp.experts.down_proj"]})
    assert options["lora_target_parameters"] == "mlp.experts.down_proj,mlp.experts.gate_up_proj"
    assert options["lora_target_modules"] == "q_proj"


def test_peft_config_rank_and_alpha_patterns_train_as_the_program(tmp_path, program, bert_config):
    train = read_glue("train.csv")
    base = trainer(tmp_path / "base", bert_config, train, max_steps=1)  # a base with weights
    base.train()
    folder = str(tmp_path / "base" / "api")
    lora = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["query", "value"],
            "rank_pattern": {"value": 2}, "alpha_pattern": {"value": 6}}
    args = brisk.TrainingArguments(output_dir=str(tmp_path / "api"), **dict(RUN, max_steps=2))
    t = brisk.Trainer(model=folder, args=args, train_dataset=train, peft_config=lora)
    t.train()
    saved = json.load(open(tmp_path / "api" / "adapter_config.json"))
    assert saved["rank_pattern"] == {"value": 2} and saved["alpha_pattern"] == {"value": 6}
    cli = run_cli(program, "train", dict(
        RUN, model_name_or_path=folder, train_file=write_csv(train, tmp_path / "train.csv"),
        output_dir=str(tmp_path / "cli"), max_steps=2, use_peft=True, lora_r=4, lora_alpha=8,
        lora_dropout=0.0, lora_target_modules="query,value",
        lora_rank_pattern='{"value": 2}', lora_alpha_pattern='{"value": 6}'))
    assert [v for _, v in api_losses(t)] == pytest.approx([v for _, v in losses(cli)], rel=1e-6)
    with pytest.raises(ValueError, match="rank_pattern must be a dict"):
        brisk.Trainer(model=folder, args=args, peft_config=dict(lora, rank_pattern=[2]))


def test_quantization_config_trains_qlora_as_the_program(tmp_path, program):
    """A BitsAndBytesConfig's keys with peft_config: the program's QLoRA run (--load_in_4bit),
    and the adapter evaluated on the 4-bit base."""
    config = tmp_path / "model" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(dict(TINY_BERT, num_hidden_layers=4)))
    train, dev = read_glue("train.csv"), read_glue("dev.csv")
    base = trainer(tmp_path / "base", str(config), train, max_steps=1)
    base.train()
    folder = str(tmp_path / "base" / "api")
    lora = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["query", "value"]}
    bnb = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
           "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "float32",
           "quant_method": "bitsandbytes"}
    args = brisk.TrainingArguments(output_dir=str(tmp_path / "api"), **dict(RUN, max_steps=3))
    t = brisk.Trainer(model=folder, args=args, train_dataset=train, peft_config=lora,
                      quantization_config=bnb)
    t.train()
    cli = run_cli(program, "train", dict(
        RUN, model_name_or_path=folder, train_file=write_csv(train, tmp_path / "train.csv"),
        output_dir=str(tmp_path / "cli"), max_steps=3, use_peft=True, lora_r=4, lora_alpha=8,
        lora_dropout=0.0, lora_target_modules="query,value", load_in_4bit=True,
        use_bnb_nested_quant=True))
    assert [v for _, v in api_losses(t)] == pytest.approx([v for _, v in losses(cli)], rel=1e-6)
    assert "eval_loss" in t.evaluate(dev)
    for bad, message in [(dict(bnb, load_in_4bit=False, load_in_8bit=True), "load_in_8bit"),
                         (dict(bnb, bnb_4bit_compute_dtype="bfloat16"), "differs from the run's"),
                         (dict(bnb, llm_int8_skip_modules=["classifier"]),
                          "llm_int8_skip_modules is set")]:
        with pytest.raises(ValueError, match=message):
            brisk.Trainer(model=folder, args=args, peft_config=lora, quantization_config=bad)
