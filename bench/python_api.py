"""The main job through the Python package against the brisk program: the same engine, so the
table shows what the Python layer costs (writing a DataFrame as JSON Lines, the interpreter's
memory, the callbacks between steps).

    bash scripts/get_data.sh && bash scripts/test_python.sh   # builds .venv-python
    python3 bench/python_api.py --max_steps 100

Each run: all-MiniLM-L6-v2 on the Rotten Tomatoes CSVs (run_glue's options as scripts/run.sh,
batch 32 x 64 tokens), no tokenization cache (each run tokenizes its data), then evaluated.
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BRISK, ROOT, cpu_name  # noqa: E402

PYTHON = os.path.join(ROOT, ".venv-python", "bin", "python")
DATA = os.path.join(ROOT, "data")
OPTIONS = {"max_seq_length": 64, "per_device_train_batch_size": 32, "learning_rate": 5e-5,
           "num_train_epochs": 1, "logging_steps": 50, "save_strategy": "no",
           "tokenized_cache_dir": "none", "disable_tqdm": True}

API_RUN = r"""
import json, sys, time
start = time.time()
import pandas as pd
import brisk
options, out, how = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
train_csv, dev_csv = sys.argv[4], sys.argv[5]
train = pd.read_csv(train_csv) if how == "dataframe" else train_csv
dev = pd.read_csv(dev_csv) if how == "dataframe" else dev_csv
args = brisk.TrainingArguments(output_dir=out, **options)
trainer = brisk.Trainer(model=sys.argv[6], args=args, train_dataset=train, eval_dataset=dev)
trainer.train()
metrics = trainer.evaluate()
print(json.dumps({"wall": time.time() - start, "eval_accuracy": metrics["eval_accuracy"]}))
"""


def results(out):
    with open(os.path.join(out, "train_results.json")) as f:
        return json.load(f)


def run_program(steps, out):
    flags = []
    for key, value in dict(OPTIONS, max_steps=steps).items():
        flags += ["--" + key, json.dumps(value) if isinstance(value, bool) else str(value)]
    start = time.time()
    subprocess.run([BRISK, "train", "--model", os.path.join(DATA, "all-MiniLM-L6-v2"),
                    "--train_file", os.path.join(DATA, "rotten_tomatoes", "train.csv"),
                    "--validation_file", os.path.join(DATA, "rotten_tomatoes", "validation.csv"),
                    "--do_eval", "--output_dir", out] + flags,
                   check=True, capture_output=True, text=True)
    wall = time.time() - start
    with open(os.path.join(out, "eval_results.json")) as f:
        accuracy = json.load(f)["eval_accuracy"]
    return wall, accuracy


def run_api(steps, out, how):
    done = subprocess.run(
        [PYTHON, "-c", API_RUN, json.dumps(dict(OPTIONS, max_steps=steps)), out, how,
         os.path.join(DATA, "rotten_tomatoes", "train.csv"),
         os.path.join(DATA, "rotten_tomatoes", "validation.csv"),
         os.path.join(DATA, "all-MiniLM-L6-v2")],
        check=True, capture_output=True, text=True)
    last = json.loads(done.stdout.strip().splitlines()[-1])
    return last["wall"], last["eval_accuracy"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max_steps", type=int, default=100)
    steps = parser.parse_args().max_steps
    rows = []
    for name, run in [("brisk program (CSV files)", lambda o: run_program(steps, o)),
                      ("Python API, file paths", lambda o: run_api(steps, o, "paths")),
                      ("Python API, DataFrames", lambda o: run_api(steps, o, "dataframe"))]:
        out = os.path.join(ROOT, "output", "bench-python-api", name.split()[0] + str(len(rows)))
        wall, accuracy = run(out)
        r = results(out)
        rows.append((name, r["train_samples_per_second"], wall, r["memory"]["peak_rss_bytes"],
                     accuracy))
    base = rows[0]
    print("Machine: %s, %d steps\n" % (cpu_name(), steps))
    print("| run | train samples/s | whole run (s) | peak process memory | eval accuracy |")
    print("|---|---|---|---|---|")
    for name, sps, wall, peak, accuracy in rows:
        print("| %s | %.1f (%.2fx) | %.1f | %.0f MiB (%+.0f MiB) | %.2f%% |"
              % (name, sps, sps / base[1], wall, peak / 2**20, (peak - base[3]) / 2**20,
                 100 * accuracy))


if __name__ == "__main__":
    main()
