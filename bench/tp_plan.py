"""Tensor parallelism's memory per rank: brisk's plan of each tensor rank (`brisk estimate
--tp_size t --world_size t`) for GPT-2 124M and a Llama with 7B's shape, next to Megatron-LM's
per-layer activation formula (Korthikanti et al. 2022, arXiv 2205.05198, Table 2: tensor
parallelism without sequence parallelism keeps s b h (10 + 24/t + 5 a s / (h t)) bytes per
layer in 16-bit activations; with flash attention, as brisk's, the 5 a s / (h t) term of the
score matrix is not kept). Then a measured run on this machine's CPU: one process with every
thread against t ranks of one thread each (mpirun), the same global batch, GPT-2 124M: step
speed, the planned bytes and rank 0's peak.

    python3 bench/tp_plan.py [--measure_model gpt2] [--max_steps 4]
"""
import argparse
import os
import tempfile

from common import LAYOUT_SHAPES as SHAPES, cpu_name, layout_plan_table, layout_train

MIB = 2**20


def megatron_layer_bytes(s, b, h, t):
    return s * b * h * (10 + 24 / t)


def measured_table(a, tmp):
    cores = os.cpu_count()
    print(f"\n{a.measure_model}, batch {a.batch} x {a.seq}, bf16, {a.max_steps} steps, "
          f"{cpu_name()}, {cores} cores")
    print("| layout | samples/s | loss | planned / rank | rank 0's peak RSS "
          "| summed over the tensor group / step | formula | sums' share of the run |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    _, _, _, hidden, _, layers = next(s for s in SHAPES if s[0] == a.measure_model)
    for tp, threads in ((1, cores), (2, max(1, cores // 2))):
        r = layout_train("tp_size", tp, threads, a.measure_model, a.batch, a.seq, a.max_steps,
                         os.path.join(tmp, f"tp{tp}"))
        mem = r["memory"]
        planned = sum(mem["planned_bytes"].values())
        summed = r.get("tensor_parallel_sum_bytes", 0) / a.max_steps
        # 4 float32 [B, T, C] sums per block per micro-batch (2 forward, 2 backward), and the
        # vocabulary's: the embeddings' output, the head's input gradient, 3 statistics a row
        # from each rank.
        rows = a.batch * a.seq
        formula = (4 * layers + 2) * rows * hidden * 4 + rows * 3 * 4 * tp if tp > 1 else 0
        print(f"| tp {tp} ({tp} x {threads} threads) | {r['train_samples_per_second']:.2f} "
              f"| {r['train_loss']:.4f} | {planned / MIB:.0f} MiB "
              f"| {mem['peak_rss_bytes'] / MIB:.0f} MiB | {summed / MIB:.1f} MiB "
              f"| {formula / MIB:.1f} MiB "
              f"| {r['communication_seconds'] / r['train_runtime']:.0%} |")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--measure_model", default="gpt2")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--max_steps", type=int, default=4)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        layout_plan_table("tp_size", "tp", "per layer (Megatron, flash)", megatron_layer_bytes, tmp)
        measured_table(a, tmp)


if __name__ == "__main__":
    main()
