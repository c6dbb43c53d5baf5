"""Sequence parallelism's memory per rank and what its all-to-alls pass: brisk's plan of each
sequence rank (`brisk estimate --sp_size s --world_size s`) for GPT-2 124M and a Llama with 7B's
shape, the activations one block keeps next to Megatron-LM's per-layer formula for one device
(Korthikanti et al. 2022, arXiv 2205.05198, Table 2: s b h (34 + 5 a s / h) bytes in 16-bit
activations; with flash attention, as brisk's, no score matrix: 34 s b h) over the degree, as
DeepSpeed-Ulysses divides it. Then a measured run on this machine's CPU: one process with every
thread against s ranks of one thread each (mpirun), the same global batch, GPT-2 124M: step
speed, the planned bytes, rank 0's peak, and the bytes rank 0 passed to its all-to-alls per step
against the formula `brisk estimate --sp_size` prints (sequence_exchange_bytes).

    python3 bench/sp_plan.py [--measure_model gpt2] [--max_steps 4]
"""
import argparse
import json
import os
import subprocess
import tempfile

from common import cpu_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BRISK = os.environ.get("BRISK_BIN", os.path.join(ROOT, "build", "brisk"))
MIB = 2**20
STATES = ("weights", "master_weights", "gradients", "optimizer_state")
# name, batch, sequence, hidden, heads, layers
SHAPES = [("gpt2", 4, 1024, 768, 12, 12), ("llama-2-7b", 1, 4096, 4096, 32, 32)]
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_btl_vader_single_copy_mechanism="none")


def plan(model, batch, seq, sp, tmp):
    out = os.path.join(tmp, f"{model}_{sp}.json")
    r = subprocess.run([BRISK, "estimate", "--model_name_or_path", model, "--sp_size", str(sp),
                        "--world_size", str(sp), "--per_device_train_batch_size", str(batch),
                        "--seq_len", str(seq), "--bf16", "--output_json", out],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip().splitlines()[-1]
    return json.load(open(out))["memory"], None


def plan_table(tmp):
    print("| model | sp | model states / rank | activations / rank | total / rank "
          "| per block (brisk) | per layer (Megatron, flash) / sp | brisk / Megatron |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for model, b, s, h, _, _ in SHAPES:
        for sp in (1, 2, 4, 8):
            m, error = plan(model, b, s, sp, tmp)
            if m is None:
                print(f"| {model} | {sp} | refused: {error} | | | | | |")
                continue
            planned = m["planned_bytes"]
            states = sum(planned[k] for k in STATES)
            block = m["activations_per_block_bytes"]
            formula = 34 * s * b * h / sp
            print(f"| {model} b{b} s{s} | {sp} | {states / MIB:.0f} MiB "
                  f"| {planned['activations'] / MIB:.0f} MiB "
                  f"| {m['planned_total_bytes'] / MIB:.0f} MiB | {block / MIB:.1f} MiB "
                  f"| {formula / MIB:.1f} MiB | {block / formula:.2f} |")


def estimated_exchange(model, a, sp, tmp):
    """What `brisk estimate --sp_size` says a rank passes to its all-to-alls per step."""
    out = os.path.join(tmp, f"exchange_{sp}.json")
    subprocess.run([BRISK, "estimate", "--model_name_or_path", model, "--sp_size", str(sp),
                    "--world_size", str(sp), "--per_device_train_batch_size", str(a.batch),
                    "--seq_len", str(a.seq), "--bf16", "--output_json", out],
                   check=True, capture_output=True, text=True)
    return json.load(open(out))["sequence_parallel"]["all_to_all_bytes_per_step"]


def train(model, sp, threads, a, out):
    args = [BRISK, "train", "--model_name_or_path", model, "--sp_size", str(sp),
            "--per_device_train_batch_size", str(a.batch), "--seq_len", str(a.seq),
            "--max_steps", str(a.max_steps), "--logging_steps", str(a.max_steps),
            "--output_dir", out, "--disable_tqdm", "--save_strategy", "no", "--bf16",
            "--dataset_size", str(a.batch * a.max_steps)]
    env = dict(ENV, OMP_NUM_THREADS=str(threads))
    if sp > 1:
        args = ["mpirun", "-np", str(sp), "--oversubscribe", "--bind-to", "none"] + args
    subprocess.run(args, check=True, env=env, capture_output=True, text=True)
    return json.load(open(os.path.join(out, "train_results.json")))


def measured_table(a, tmp):
    cores = os.cpu_count()
    print(f"\n{a.measure_model}, batch {a.batch} x {a.seq}, bf16, {a.max_steps} steps, "
          f"{cpu_name()}, {cores} cores")
    print("| layout | samples/s | loss | planned / rank | rank 0's peak RSS "
          "| all-to-all bytes / step (rank 0) | formula | all-to-alls' share of the run "
          "| all communication's share |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for sp, threads in ((1, cores), (2, max(1, cores // 2))):
        r = train(a.measure_model, sp, threads, a, os.path.join(tmp, f"sp{sp}"))
        mem = r["memory"]
        planned = sum(mem["planned_bytes"].values())
        passed = r.get("sequence_all_to_all_bytes", 0) / a.max_steps
        formula = estimated_exchange(a.measure_model, a, sp, tmp) if sp > 1 else 0
        print(f"| sp {sp} ({sp} x {threads} threads) | {r['train_samples_per_second']:.2f} "
              f"| {r['train_loss']:.4f} | {planned / MIB:.0f} MiB "
              f"| {mem['peak_rss_bytes'] / MIB:.0f} MiB | {passed / MIB:.1f} MiB "
              f"| {formula / MIB:.1f} MiB "
              f"| {r.get('sequence_all_to_all_seconds', 0) / r['train_runtime']:.0%} "
              f"| {r['communication_seconds'] / r['train_runtime']:.0%} |")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--measure_model", default="gpt2")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--max_steps", type=int, default=4)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        plan_table(tmp)
        measured_table(a, tmp)


if __name__ == "__main__":
    main()
