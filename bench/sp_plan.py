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
import os
import tempfile

from common import cpu_name, layout_estimate, layout_plan_table, layout_train

MIB = 2**20


def ulysses_layer_bytes(s, b, h, sp):
    """Megatron-LM's per-layer bytes on one device with flash attention, over the degree."""
    return 34 * s * b * h / sp


def measured_table(a, tmp):
    cores = os.cpu_count()
    print(f"\n{a.measure_model}, batch {a.batch} x {a.seq}, bf16, {a.max_steps} steps, "
          f"{cpu_name()}, {cores} cores")
    print("| layout | samples/s | loss | planned / rank | rank 0's peak RSS "
          "| all-to-all bytes / step (rank 0) | formula | all-to-alls' share of the run "
          "| all communication's share |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for sp, threads in ((1, cores), (2, max(1, cores // 2))):
        r = layout_train("sp_size", sp, threads, a.measure_model, a.batch, a.seq, a.max_steps,
                         os.path.join(tmp, f"sp{sp}"))
        mem = r["memory"]
        planned = sum(mem["planned_bytes"].values())
        passed = r.get("sequence_all_to_all_bytes", 0) / a.max_steps
        formula = 0
        if sp > 1:  # what `brisk estimate --sp_size` says a rank passes per step
            j, _ = layout_estimate("sp_size", sp, a.measure_model, a.batch, a.seq, tmp)
            formula = j["sequence_parallel"]["all_to_all_bytes_per_step"]
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
        layout_plan_table("sp_size", "sp", "per layer (Megatron, flash) / sp", ulysses_layer_bytes,
                          tmp)
        measured_table(a, tmp)


if __name__ == "__main__":
    main()
