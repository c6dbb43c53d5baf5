# brisk from Python, notebook style (each "# %%" is a cell): the README's main job through the
# Trainer API. Needs `pip install .` and the data of scripts/get_data.sh; run from the checkout:
#     python python/examples/fine_tune.py
# %%
import pandas as pd

import brisk

train = pd.read_csv("data/rotten_tomatoes/train.csv")
dev = pd.read_csv("data/rotten_tomatoes/validation.csv")
args = brisk.TrainingArguments(output_dir="output/minilm-rotten-tomatoes-py",
                               max_seq_length=64, per_device_train_batch_size=32,
                               learning_rate=5e-5, num_train_epochs=1, logging_steps=50,
                               eval_strategy="epoch", save_strategy="no")
trainer = brisk.Trainer(model="data/all-MiniLM-L6-v2", args=args, train_dataset=train,
                        eval_dataset=dev)

# %% The memory of the run, by category, before it starts.
plan = trainer.estimate_memory()
for category, size in plan["memory"]["planned_bytes"].items():
    print("%-22s %8.1f MiB" % (category, size / 2**20))

# %% Train (Ctrl-C stops at the end of the step under way, the model saved), then evaluate.
result = trainer.train()
print(result.global_step, result.training_loss)
print(trainer.evaluate())

# %% Predictions (logits) as a NumPy array, and the memory anatomy (a picture in Jupyter).
print(trainer.predict(dev.head(8)).predictions.argmax(-1))
print(trainer.memory_table())
trainer.memory_html()
