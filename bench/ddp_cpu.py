"""Data parallel on one machine's CPU: one brisk process with all threads against N processes
(mpirun) with threads split among them, at the same global batch; samples/s side by side.

    python3 bench/ddp_cpu.py [--model distilbert-base-uncased] [--ranks 2] [--max_steps 10]
"""
import argparse
import json
import os
import subprocess
import tempfile

from common import cpu_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BRISK = os.environ.get("BRISK_BIN", os.path.join(ROOT, "build", "brisk"))


def run(ranks, threads, a, out):
    args = [BRISK, "train", "--model", a.model, "--per_device_train_batch_size",
            str(a.batch // ranks), "--seq_len", str(a.seq), "--max_steps", str(a.max_steps),
            "--logging_steps", str(a.max_steps), "--output_dir", out, "--disable_tqdm",
            "--save_strategy", "no", "--dataset_size", str(a.batch * a.max_steps)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none")
    if ranks > 1:
        args = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none"] + args
    subprocess.run(args, check=True, env=env, capture_output=True, text=True)
    train = json.load(open(os.path.join(out, "train_results.json")))
    return (train["train_samples_per_second"], train["train_loss"],
            train.get("communication_seconds", 0) / train["train_runtime"])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="distilbert-base-uncased")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch", type=int, default=8, help="the global batch")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--max_steps", type=int, default=10)
    a = p.parse_args()
    cores = os.cpu_count()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in (1, a.ranks):
            threads = max(1, cores // ranks)
            sps, loss, comm = run(ranks, threads, a, os.path.join(tmp, f"r{ranks}"))
            rows.append((ranks, threads, sps, loss, comm))
    print(f"\n{a.model}, global batch {a.batch} x {a.seq} tokens, {a.max_steps} steps, synthetic "
          f"data; CPU: {cpu_name()}, {cores} threads")
    print("| processes x threads | train samples/s | share of the run in gradient sums | train loss |")
    print("|---|---|---|---|")
    base = rows[0][2]
    for ranks, threads, sps, loss, comm in rows:
        print(f"| {ranks} x {threads} | {sps:.3f} ({sps / base:.2f}x) | {comm:.0%} | {loss:.4f} |")


if __name__ == "__main__":
    main()
