"""Trainer: transformers' Trainer shape over brisk's engine.

Each of train(), evaluate() and predict() is one engine run in this process, with every byte
planned before its first step. The model between runs lives in files: after train() it is the
folder output_dir holds (config, weights, tokenizer), which evaluate(), predict() and
save_model() then read.
"""

import collections
import json
import os
import shutil

import numpy as np

from . import _brisk, checks
from .callbacks import CallbackHandler, TrainerControl, TrainerState
from .data import source
from .training_args import TrainingArguments

TrainOutput = collections.namedtuple("TrainOutput", ["global_step", "training_loss", "metrics"])
PredictionOutput = collections.namedtuple("PredictionOutput",
                                          ["predictions", "label_ids", "metrics"])
EvalPrediction = collections.namedtuple("EvalPrediction", ["predictions", "label_ids"])

_TRAIN_METRICS = ("train_runtime", "train_samples_per_second", "train_steps_per_second",
                  "total_flos", "train_loss", "epoch")
_MODEL_FILES_SKIPPED = ("checkpoint-", "runs", "tokenized_cache", "brisk_inputs")


class Trainer:
    """Trains, evaluates and predicts as transformers' Trainer does, natively.

    model: a model folder (config.json, model.safetensors, tokenizer files), a config.json, one
    of brisk's built-in configuration names (random weights), or a config as a dict.
    args: brisk.TrainingArguments, a transformers.TrainingArguments, a dict of its keys, or None.
    Datasets: file paths (CSV, TSV, JSON Lines, text), datasets.Dataset or DatasetDict, pandas
    DataFrames, dicts of columns or lists of records, with text columns brisk tokenizes or
    input_ids it reads in place.
    tokenizer (or processing_class): a folder or tokenizer file, when the model folder has none.
    callbacks: TrainerCallback objects (brisk's or transformers'), called between steps.
    compute_metrics: called after each evaluation (inside train() and by evaluate()) with
    EvalPrediction(logits, label_ids); its metrics join brisk's own, prefixed eval_ (and may be
    metric_for_best_model).
    peft_config: a peft.LoraConfig (or a dict of its keys), as TRL's SFTTrainer takes it: train
    LoRA adapters on the frozen model. train() saves the adapter (PEFT's files) in output_dir;
    evaluate() and predict() then run the model with it, and save_model() copies it.
    quantization_config: a transformers.BitsAndBytesConfig (or a dict of its keys) with
    load_in_4bit, as from_pretrained takes it: the frozen model kept 4-bit under the adapters
    (QLoRA; bnb_4bit_quant_type, bnb_4bit_use_double_quant).
    """

    def __init__(self, model=None, args=None, train_dataset=None, eval_dataset=None,
                 tokenizer=None, processing_class=None, compute_metrics=None, callbacks=None,
                 data_collator=None, peft_config=None, quantization_config=None):
        if model is None:
            raise ValueError("Trainer needs a model: a folder, a config.json, a built-in name or "
                             "a config dict")
        if data_collator is not None:
            raise ValueError("data_collator: brisk pads and collates natively (dynamic "
                             "padding: TrainingArguments' group_by_length and the engine's "
                             "own); leave it None")
        self.args = TrainingArguments.of(args)
        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset
        self.compute_metrics = compute_metrics
        tokenizer = tokenizer if tokenizer is not None else processing_class
        self._tokenizer = "" if tokenizer is None else _path_of(tokenizer, "tokenizer")
        self._model = self._model_source(model)
        self._lora = _lora_options(peft_config)
        self._quantized = _quantization_options(quantization_config, self.args)
        self._adapter = ""  # the trained adapter's folder, once train() saved one
        self.callback_handler = CallbackHandler(callbacks or [])
        self.state = TrainerState()
        self.control = TrainerControl()
        self.memory = None  # the last run's memory anatomy (train_results.json's "memory")

    # --- what transformers' Trainer offers -------------------------------------------------

    def train(self, resume_from_checkpoint=None):
        """Trains on train_dataset (evaluating on eval_dataset as eval_strategy says); returns
        TrainOutput(global_step, training_loss, metrics). Ctrl-C ends the run at the end of the
        step under way, with the model and state saved, then raises KeyboardInterrupt."""
        if self.train_dataset is None:
            raise ValueError("Trainer.train() needs a train_dataset")
        resume = _checkpoint(resume_from_checkpoint)
        files, tokenized = self._data(train=self.train_dataset, eval=self.eval_dataset)
        options = self._options(do_train=True, do_eval=False, do_predict=False, **files)
        if resume:
            options["resume_from_checkpoint"] = resume
        self.control = TrainerControl()
        self.state = TrainerState()
        self.callback_handler.call("on_train_begin", self.args, self.state, self.control)
        try:
            summary, _ = self._run(options, tokenized)
        except KeyboardInterrupt:  # the run ended after a step, its model and state saved
            self._trained()
            raise
        self._trained()
        metrics = {k: summary[k] for k in _TRAIN_METRICS if k in summary}
        self.callback_handler.call("on_train_end", self.args, self.state, self.control)
        return TrainOutput(summary["global_step"], summary["train_loss"], metrics)

    def evaluate(self, eval_dataset=None, metric_key_prefix="eval"):
        """The model's metrics on eval_dataset (default: the Trainer's), as eval_results.json,
        with compute_metrics' (prefixed eval_) where it is given."""
        data = eval_dataset if eval_dataset is not None else self.eval_dataset
        if data is None:
            raise ValueError("Trainer.evaluate() needs an eval_dataset")
        if metric_key_prefix != "eval":
            raise ValueError("metric_key_prefix: brisk names evaluation metrics eval_*")
        files, tokenized = self._data(eval=data)
        options = self._options(do_train=False, do_eval=True, do_predict=False, **files)
        summary, _ = self._run(options, tokenized)
        metrics = summary["eval_metrics"]
        if self.state.epoch:  # the run evaluated the model of that epoch, which it did not train
            metrics["epoch"] = self.state.epoch
        self.callback_handler.call("on_evaluate", self.args, self.state, self.control,
                                   metrics=metrics)
        return metrics

    def predict(self, test_dataset):
        """PredictionOutput(predictions, label_ids, metrics): the rows' logits as a NumPy array
        [rows, num_labels] (a regression's numbers: [rows, 1]), the dataset's labels where it has
        them; predict_results.txt in output_dir holds the predicted labels by name."""
        if test_dataset is None:
            raise ValueError("Trainer.predict() needs a test_dataset")
        files, tokenized = self._data(test=test_dataset)
        options = self._options(do_train=False, do_eval=False, do_predict=True, **files)
        summary, (logits, label_ids) = self._run(options, tokenized)
        return PredictionOutput(logits, label_ids, summary["predict_metrics"])

    def save_model(self, output_dir=None):
        """Writes the model folder (config, weights, tokenizer files) into output_dir (default:
        args.output_dir, where train() already saved it)."""
        target = (checks.path(output_dir, "output_dir") if output_dir is not None
                  else self.args.output_dir)
        source = self._adapter or self._model
        if not os.path.isdir(source):
            raise ValueError("save_model: the model is %r, no trained folder yet: call train()"
                             % source)
        if os.path.abspath(source) == os.path.abspath(target):
            return
        os.makedirs(target, exist_ok=True)
        for name in os.listdir(source):
            path = os.path.join(source, name)
            if os.path.isfile(path) and not name.startswith(_MODEL_FILES_SKIPPED):
                shutil.copy2(path, os.path.join(target, name))

    def estimate_memory(self, world_size=1):
        """The plan of the training run these arguments describe, before any run: the JSON of
        `brisk estimate --output_json` (memory.planned_bytes holds the bytes by category)."""
        world_size = checks.whole(world_size, "world_size", 1, 2**20)
        files, tokenized = self._data(train=self.train_dataset, eval=self.eval_dataset)
        options = self._options(do_train=True, do_eval=False, do_predict=False, **files)
        return json.loads(_brisk.estimate(checks.dumps(options), tokenized, world_size))

    def memory_table(self):
        """The last run's memory anatomy as text: planned bytes by category, then measured."""
        if not self.memory:
            raise ValueError("no run yet: memory_table() follows train(), evaluate() or "
                             "predict() (estimate_memory() plans one before)")
        mib = 1 << 20
        lines = ["%-22s %12s" % ("memory", "MiB")]
        for category, size in self.memory["planned_bytes"].items():
            lines.append("%-22s %12.1f" % (category, size / mib))
        for key, name in (("arena_bytes", "planned (allocated)"), ("peak_rss_bytes",
                                                                   "process peak"),
                          ("peak_rss_steps_bytes", "  during steps"),
                          ("device_memory_used_bytes", "GPU memory occupied")):
            if self.memory.get(key, -1) >= 0:
                lines.append("%-22s %12.1f" % (name, self.memory[key] / mib))
        return "\n".join(lines)

    def memory_html(self):
        """The last run's memory anatomy (output_dir/memory.html), displayable in Jupyter."""
        return _Html(os.path.join(self.args.output_dir, "memory.html"))

    def add_callback(self, callback):
        self.callback_handler.add(callback)

    # --- the engine runs ---------------------------------------------------------------------

    def _inputs(self):
        return os.path.join(self.args.output_dir, "brisk_inputs")

    def _model_source(self, model):
        if isinstance(model, dict):
            text = checks.dumps(model, "model", indent=2)
            folder = self._inputs()
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, "config.json")
            with open(path, "w", encoding="utf-8") as out:
                out.write(text)
            return path
        return _path_of(model, "model")

    def _data(self, **splits):
        """The run's data: options naming files, and the tokenized splits' arrays (or None)."""
        option = {"train": "train_file", "eval": "validation_file", "test": "test_file"}
        files, tokenized = {name: "" for name in option.values()}, {}
        for role, data in splits.items():
            path, arrays = source(data, role, self._inputs())
            if arrays is not None:
                tokenized[role] = arrays
            files[option[role]] = path
        if tokenized and any(files.values()):
            raise ValueError("give a run's datasets all as text or all tokenized (input_ids)")
        return files, tokenized or None

    def _trained(self):
        """After train(): the model (or, with peft_config, the adapter) is output_dir's."""
        if self._lora:
            self._adapter = self.args.output_dir
        else:
            self._model = self.args.output_dir
        self._read_state()

    def _options(self, **run):
        options = self.args.given()
        options["model_name_or_path"] = self._model
        if self._tokenizer:
            options["tokenizer_name"] = self._tokenizer
        if self._adapter:  # the trained adapter sets itself
            options["adapter_name_or_path"] = self._adapter
        elif self._lora and (run["do_train"] or not self._adapter):
            options.update(self._lora)
        options.update(self._quantized)  # the frozen base 4-bit, with the adapter or under it
        options.update(run)
        if not options["do_train"]:  # evaluate() and predict(): the strategies are train()'s
            options.update(eval_strategy="no", load_best_model_at_end=False)
        return options

    def _run(self, options, tokenized=None):
        """One engine run: its summary and the prediction set's (logits, label_ids)."""
        def on_log(text):
            record = json.loads(text)
            if not options["do_train"] and "epoch" in record and self.state.epoch:
                record["epoch"] = self.state.epoch  # of the model trained, as Trainer logs it
            if any(k in record for k in ("loss", "eval_loss", "train_runtime")):
                self.state.log_history.append(record)
                self.state.global_step = record.get("step", self.state.global_step)
                self.state.epoch = record.get("epoch", self.state.epoch)
            if progress is not None and progress.bar is not None:
                progress.bar.write(json.dumps(record))  # above the bar
            else:
                print(json.dumps(record), flush=True)  # as the program prints its records
            self.callback_handler.call("on_log", self.args, self.state, self.control,
                                       logs=record)
            if "eval_loss" in record and "step" in record:
                self.callback_handler.call("on_evaluate", self.args, self.state, self.control,
                                           metrics=record)

        def on_save(checkpoint):
            self.callback_handler.call("on_save", self.args, self.state, self.control,
                                       checkpoint=checkpoint)

        def on_epoch_end(step):
            self.state.global_step = step
            self.callback_handler.call("on_epoch_end", self.args, self.state, self.control)

        def on_step_end(step, max_steps):
            self.state.global_step, self.state.max_steps = step, max_steps
            if progress is not None:
                progress.update(step, max_steps)
            self.callback_handler.call("on_step_end", self.args, self.state, self.control)
            return bool(self.control.should_training_stop)

        progress = _Progress.open(self.args, options)
        try:
            text, logits, label_ids = _brisk.train(checks.dumps(options), tokenized, on_log,
                                                   on_save, on_epoch_end, on_step_end,
                                                   self._evaluation_metrics())
            result = json.loads(text), (logits, label_ids)
        finally:
            if progress is not None:
                progress.close()
        summary, predicted = result
        self.memory = summary.get("memory", self.memory)
        return summary, predicted

    def _evaluation_metrics(self):
        """compute_metrics as the engine calls it after each evaluation: the rows' logits and
        their labels as the engine read them in, its metrics (prefixed eval_) out as JSON; None
        without compute_metrics."""
        if self.compute_metrics is None:
            return None
        if not callable(self.compute_metrics):
            raise TypeError("compute_metrics must be a function of an EvalPrediction, not %s"
                            % type(self.compute_metrics).__name__)

        def metrics(logits, label_ids):
            computed = _metrics_of(self.compute_metrics(EvalPrediction(logits, label_ids)))
            return checks.dumps({(k if k.startswith("eval_") else "eval_" + k): v
                                 for k, v in computed.items()})
        return metrics

    def _read_state(self):
        path = os.path.join(self.args.output_dir, "trainer_state.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                self.state.update(json.load(f))


def _checkpoint(value):
    """resume_from_checkpoint as the engine's option: True (the last checkpoint) or a folder;
    "" for None or False (no resume)."""
    if value is None or value is False:
        return ""
    if value is True:
        return "last"
    if isinstance(value, (str, os.PathLike)):
        return checks.path(value, "resume_from_checkpoint")
    raise TypeError("resume_from_checkpoint must be a checkpoint folder, True (the last) or "
                    "None, not %s" % type(value).__name__)


def _metrics_of(computed):
    """compute_metrics' result checked: a dict of names (str) to finite numbers (NumPy scalars
    too)."""
    if not isinstance(computed, dict):
        raise TypeError("compute_metrics must return a dict of metric names to numbers, not %s"
                        % type(computed).__name__)
    metrics = {}
    for name, value in computed.items():
        if not isinstance(name, str):
            raise TypeError("compute_metrics returned the key %s: metric names are str"
                            % checks.shown(name))
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]
        metrics[name] = checks.real(value, "compute_metrics' %s" % name)
    return metrics


def _path_of(value, what):
    if isinstance(value, (str, os.PathLike)):
        return checks.path(value, what)
    name = getattr(value, "name_or_path", None)  # a transformers model or tokenizer
    if isinstance(name, str) and os.path.exists(name):
        return name
    raise TypeError("%s: give a folder, a file or a built-in name, not %s"
                    % (what, type(value).__name__))


class _Progress:
    """The steps as a tqdm bar (tqdm.auto: a widget in Jupyter, text in a terminal) in place of
    the engine's own, where tqdm is installed and disable_tqdm is off."""

    @classmethod
    def open(cls, args, options):
        if args.disable_tqdm:
            return None
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return None  # the engine draws its own on a terminal
        options["disable_tqdm"] = True
        return cls(tqdm)

    def __init__(self, tqdm):
        self._tqdm = tqdm
        self.bar = None

    def update(self, step, max_steps):
        if self.bar is None:
            self.bar = self._tqdm(total=max_steps, initial=step - 1, unit="step")
        self.bar.update(step - self.bar.n)

    def close(self):
        if self.bar is not None:
            self.bar.close()


class _Html:
    def __init__(self, path):
        self.path = path

    def _repr_html_(self):
        with open(self.path, encoding="utf-8") as f:
            return f.read()


# PEFT's LoraConfig keys brisk follows (as the lora_* options), and those that change nothing in
# a LoRA run; any other key PEFT sets away from its default is refused by name.
_LORA_KEYS = {"r": "lora_r", "lora_alpha": "lora_alpha", "lora_dropout": "lora_dropout",
              "target_modules": "lora_target_modules", "modules_to_save": "lora_modules_to_save",
              "target_parameters": "lora_target_parameters", "use_rslora": "use_rslora",
              "rank_pattern": "lora_rank_pattern", "alpha_pattern": "lora_alpha_pattern"}
_LORA_INERT = ("peft_type", "task_type", "base_model_name_or_path", "revision", "inference_mode",
               "init_lora_weights", "fan_in_fan_out", "bias", "peft_version", "auto_mapping",
               "megatron_core", "qalora_group_size")


def _lora_options(config):
    """The engine's lora_* options for a peft.LoraConfig or a dict of its keys (None: none)."""
    if config is None:
        return {}
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    if not isinstance(config, dict):
        raise TypeError("peft_config must be a peft.LoraConfig or a dict of its keys, not %s"
                        % type(config).__name__)
    peft_type = str(getattr(config.get("peft_type"), "value", config.get("peft_type") or "LORA"))
    if peft_type != "LORA":
        raise ValueError("peft_config: peft_type %s: brisk trains LoRA adapters only" % peft_type)
    if config.get("bias", "none") != "none":
        raise ValueError("peft_config: bias must be 'none' (brisk trains no biases with LoRA)")
    options = {"use_peft": True}
    for key, value in config.items():
        if key in _LORA_KEYS:
            if value is None or value == {}:
                continue
            if key in ("target_modules", "modules_to_save", "target_parameters"):
                value = _module_names(value, key)
            if key in ("rank_pattern", "alpha_pattern"):
                if not isinstance(value, dict):
                    raise ValueError("peft_config: %s must be a dict of patterns and numbers"
                                     % key)
                value = json.dumps(value)  # the engine's option: the object's JSON text
            options[_LORA_KEYS[key]] = value
        elif key not in _LORA_INERT and value not in (None, False, {}, [], "", ()):
            raise ValueError("peft_config: %s is set, which brisk does not run yet (only plain "
                             "LoRA adapters)" % key)
    return options


_BNB_INERT = ("quant_method", "llm_int8_threshold", "llm_int8_has_fp16_weight",
              "llm_int8_enable_fp32_cpu_offload", "_load_in_4bit", "_load_in_8bit")


def _quantization_options(config, args):
    """The engine's 4-bit options for a BitsAndBytesConfig or a dict of its keys (None: none)."""
    if config is None:
        return {}
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    if not isinstance(config, dict):
        raise TypeError("quantization_config must be a transformers.BitsAndBytesConfig or a dict "
                        "of its keys, not %s" % type(config).__name__)
    if config.get("load_in_8bit"):
        raise ValueError("quantization_config: load_in_8bit is not built; brisk keeps a frozen "
                         "base 4-bit (load_in_4bit)")
    if not config.get("load_in_4bit"):
        raise ValueError("quantization_config: load_in_4bit must be True")
    compute = str(config.get("bnb_4bit_compute_dtype") or "float32").replace("torch.", "")
    precision = "bfloat16" if args.bf16 else "float16" if args.fp16 else "float32"
    if compute != precision:
        raise ValueError("quantization_config: bnb_4bit_compute_dtype %s differs from the run's "
                         "%s (TrainingArguments' bf16/fp16 set it)" % (compute, precision))
    storage = str(config.get("bnb_4bit_quant_storage") or "uint8").replace("torch.", "")
    if storage != "uint8":
        raise ValueError("quantization_config: bnb_4bit_quant_storage %s: brisk stores uint8"
                         % storage)
    done = {"load_in_4bit", "load_in_8bit", "bnb_4bit_compute_dtype", "bnb_4bit_quant_storage",
            "bnb_4bit_quant_type", "bnb_4bit_use_double_quant"}
    for key, value in config.items():
        if key not in done and key not in _BNB_INERT and value not in (None, False, [], ""):
            raise ValueError("quantization_config: %s is set, which brisk does not run" % key)
    return {"load_in_4bit": True,
            "bnb_4bit_quant_type": config.get("bnb_4bit_quant_type") or "nf4",
            "use_bnb_nested_quant": bool(config.get("bnb_4bit_use_double_quant"))}


def _module_names(value, key):
    """target_modules / modules_to_save / target_parameters as the engine's comma list
    ("all-linear" as it is)."""
    if isinstance(value, str):
        if key == "target_modules" and value.lower() != "all-linear":
            raise ValueError("peft_config: target_modules as a regular expression (%r) is not "
                             "taken yet; list the module names" % value)
        return value
    names = sorted(value)  # PEFT keeps them as a set
    if not all(isinstance(n, str) and n and "," not in n for n in names):
        raise ValueError("peft_config: %s must be module names" % key)
    return ",".join(names)

