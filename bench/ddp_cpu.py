"""Data parallel on one machine's CPU: one brisk process with all threads against N processes
(mpirun) with threads split among them, at the same global batch; samples/s side by side. The
N-process run twice: the gradients in one bucket summed after backward (nothing overlaps), and in
ddp_bucket_cap_mb buckets summed while backward computes the earlier layers; with the share of
the sums' time the training loop did not wait for (hidden behind computation); then with ZeRO
stages 1, 2 and 3 (stage 3's gathers of the blocks' weights count as communication too).

    python3 bench/ddp_cpu.py [--model distilbert-base-uncased] [--ranks 2] [--max_steps 10]
                             [--bucket_mb 25] [--lora]

With --lora the runs train LoRA adapters (--use_peft, PEFT's default targets) on the frozen
model: one process, then ZeRO stages 2 and 3 (stage 3 partitions the frozen blocks too).
"""
import argparse
import json
import os
import subprocess
import tempfile

from common import cpu_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BRISK = os.environ.get("BRISK_BIN", os.path.join(ROOT, "build", "brisk"))


def run(ranks, threads, bucket_mb, zero, a, out):
    args = [BRISK, "train", "--model", a.model, "--ddp_bucket_cap_mb", str(bucket_mb),
            "--zero_stage", str(zero),
            "--per_device_train_batch_size",
            str(a.batch // ranks), "--seq_len", str(a.seq), "--max_steps", str(a.max_steps),
            "--logging_steps", str(a.max_steps), "--output_dir", out, "--disable_tqdm",
            "--save_strategy", "no", "--dataset_size", str(a.batch * a.max_steps)]
    if a.lora:
        args += ["--use_peft"]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none")
    if ranks > 1:
        args = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none"] + args
    subprocess.run(args, check=True, env=env, capture_output=True, text=True)
    train = json.load(open(os.path.join(out, "train_results.json")))
    runtime = train["train_runtime"]
    memory = train["memory"]
    return (train["train_samples_per_second"], train["train_loss"],
            train["communication_seconds"] / runtime,
            train["communication_wait_seconds"] / runtime,
            memory["planned_bytes"]["optimizer_state"] / 2**20,
            memory["planned_bytes"]["gradients"] / 2**20, memory["planned_bytes"]["weights"] / 2**20,
            memory["peak_rss_steps_bytes"] / 2**20, memory["peak_rss_bytes"] / 2**20)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="distilbert-base-uncased")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch", type=int, default=8, help="the global batch")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--max_steps", type=int, default=10)
    p.add_argument("--bucket_mb", type=float, default=25, help="the overlapped run's buckets")
    p.add_argument("--lora", action="store_true", help="LoRA adapters on the frozen model")
    a = p.parse_args()
    cores = os.cpu_count()
    rows = []
    one_bucket = 1e6  # MiB: every gradient in one bucket, summed when backward has ended
    with tempfile.TemporaryDirectory() as tmp:
        runs = [(1, a.bucket_mb, 0), (a.ranks, one_bucket, 0), (a.ranks, a.bucket_mb, 0),
                (a.ranks, a.bucket_mb, 1), (a.ranks, a.bucket_mb, 2), (a.ranks, a.bucket_mb, 3)]
        if a.lora:
            runs = [runs[0], runs[4], runs[5]]
        for i, (ranks, bucket_mb, zero) in enumerate(runs):
            threads = max(1, cores // ranks)
            result = run(ranks, threads, bucket_mb, zero, a, os.path.join(tmp, str(i)))
            buckets = ("—" if ranks == 1 else "one, after backward" if bucket_mb == one_bucket
                       else "reduce-scatter per segment, in backward" if zero >= 2
                       else f"{bucket_mb:g} MiB, during backward")
            rows.append((ranks, threads, buckets, zero) + result)
    print(f"\n{a.model}{' with LoRA adapters' if a.lora else ''}, global batch {a.batch} x "
          f"{a.seq} tokens, {a.max_steps} steps, synthetic data, AdamW; CPU: {cpu_name()}, "
          f"{cores} threads")
    print("| processes x threads | gradient buckets | ZeRO stage | train samples/s | sums' time / run "
          "| waited for / run | hidden | rank 0 weights (planned) | rank 0 gradients (planned) "
          "| rank 0 optimizer state (planned) | rank 0 peak RSS in steps | rank 0 peak RSS "
          "(saves too) | train loss |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    base = rows[0][4]
    for (ranks, threads, buckets, zero, sps, loss, comm, wait, state, grads, weights, steps_peak,
         peak) in rows:
        shares = ("— | — | —" if ranks == 1 else
                  f"{comm:.0%} | {wait:.0%} | {1 - wait / comm if comm > 0 else 0:.0%}")
        print(f"| {ranks} x {threads} | {buckets} | {zero} | {sps:.3f} ({sps / base:.2f}x) | "
              f"{shares} | {weights:.0f} MiB | {grads:.0f} MiB | {state:.0f} MiB | "
              f"{steps_peak:.0f} MiB | {peak:.0f} MiB | {loss:.4f} |")


if __name__ == "__main__":
    main()
