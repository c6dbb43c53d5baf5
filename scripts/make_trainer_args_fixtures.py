"""TrainingArguments fixtures: option files written by transformers' own
TrainingArguments.to_json_string(), as a Trainer user has them, for tests/test_trainer_keys.cpp.

  python scripts/make_trainer_args_fixtures.py            # with transformers 5.x installed
  python scripts/make_trainer_args_fixtures.py --v4       # with transformers 4.46.x installed

(pip install transformers; torch is not needed.) Each run writes the files of the installed
major version under tests/fixtures/trainer_args/.
"""
import os
import sys

import transformers
from transformers import TrainingArguments

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "trainer_args")

# A run_glue-style fine-tuning with settings brisk honours, each away from its default.
SET = dict(output_dir="out", do_train=True, do_eval=True, logging_strategy="epoch",
           save_strategy="epoch", report_to=["tensorboard"], learning_rate=3e-5,
           per_device_train_batch_size=4, per_device_eval_batch_size=4, greater_is_better=True,
           metric_for_best_model="accuracy", load_best_model_at_end=True, warmup_steps=2, seed=7,
           num_train_epochs=2, weight_decay=0.01, save_total_limit=2)


def write(name, args):
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, name), "w") as f:
        f.write(args.to_json_string() + "\n")


def main():
    major = int(transformers.__version__.split(".")[0])
    if "--v4" in sys.argv:
        assert major == 4, "--v4 needs transformers 4.x installed"
        write("training_args_v4_defaults.json", TrainingArguments(output_dir="out"))
        # 4.x's older spelling of eval_strategy, and its gradient checkpointing flag.
        write("training_args_v4_set.json",
              TrainingArguments(evaluation_strategy="epoch", gradient_checkpointing=True, **SET))
    else:
        assert major >= 5, "without --v4 this needs transformers 5.x installed"
        write("training_args_v5_defaults.json", TrainingArguments(output_dir="out"))
        write("training_args_v5_set.json",
              TrainingArguments(eval_strategy="epoch", activation_checkpointing=True,
                                activation_checkpointing_kwargs={"use_reentrant": False}, **SET))


if __name__ == "__main__":
    main()
