"""TrainingArguments fixtures: option files written by transformers' own
TrainingArguments.to_json_string(), as a Trainer user has them, for tests/test_trainer_keys.cpp
and the Python package's tests.

  python scripts/make_trainer_args_fixtures.py

writes training_args_<version>[_accelerate]_{defaults,set}.json under
tests/fixtures/trainer_args/ for the transformers installed (with "_accelerate" when accelerate is
installed too: TrainingArguments then writes AcceleratorConfig's defaults). Run it once per
version kept there (4.46 through 5.x). torch is needed only where accelerate is installed.
The older training_args_v4_* (4.46, without accelerate) and training_args_v5_* (5.0, without
accelerate) were written the same way.
"""
import dataclasses
import importlib.util
import os

import transformers
from transformers import TrainingArguments

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "trainer_args")

# A run_glue-style fine-tuning with settings brisk honours, each away from its default.
SET = dict(output_dir="out", do_train=True, do_eval=True, logging_strategy="epoch",
           save_strategy="epoch", report_to=["tensorboard"], learning_rate=3e-5,
           per_device_train_batch_size=4, per_device_eval_batch_size=4, greater_is_better=True,
           metric_for_best_model="accuracy", load_best_model_at_end=True, warmup_steps=2, seed=7,
           num_train_epochs=2, weight_decay=0.01, save_total_limit=2, eval_strategy="epoch")


def write(name, args):
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, name), "w") as f:
        f.write(args.to_json_string() + "\n")


def main():
    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    tag = transformers.__version__
    if importlib.util.find_spec("accelerate") is not None:
        tag += "_accelerate"
    write("training_args_%s_defaults.json" % tag, TrainingArguments(output_dir="out"))
    # 5.x names gradient checkpointing activation_checkpointing (the older name still reads).
    if "activation_checkpointing" in fields:
        recompute = dict(activation_checkpointing=True,
                         activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        recompute = dict(gradient_checkpointing=True,
                         gradient_checkpointing_kwargs={"use_reentrant": False})
    write("training_args_%s_set.json" % tag, TrainingArguments(**recompute, **SET))


if __name__ == "__main__":
    main()
