"""Tensor parallelism's memory per rank: brisk's plan of each tensor rank (`brisk estimate
--tp_size t --world_size t`) for GPT-2 124M and a Llama with 7B's shape, next to Megatron-LM's
per-layer activation formulas (Korthikanti et al. 2022, arXiv 2205.05198, Table 2, in 16-bit
activations: s b h (10 + 24/t + 5 a s / (h t)) bytes per layer with tensor parallelism alone,
s b h (34/t + 5 a s / (h t)) with its sequence parallelism; with flash attention, as brisk's,
the 5 a s / (h t) term of the score matrix is not kept), with and without Megatron's sequence
parallelism (--tp_sequence_parallel). Then a measured run on this machine's CPU: one process
with every thread against t ranks of one thread each (mpirun), the same global batch, GPT-2 124M,
with and without it: step speed, the planned bytes, rank 0's peak, and the bytes the tensor group
summed, gathered and reduce-scattered against what `brisk estimate` predicts.

    python3 bench/tp_plan.py [--measure_model gpt2] [--max_steps 8]
"""
import argparse
import os
import tempfile

from common import cpu_name, layout_estimate, layout_plan_table, layout_train

MIB = 2**20
WHOLE_TOKENS = ("--tp_sequence_parallel", "false")


def megatron_layer_bytes(s, b, h, t):
    return s * b * h * (10 + 24 / t)


def megatron_sequence_parallel_bytes(s, b, h, t):
    return s * b * h * 34 / t


def measured_table(a, tmp):
    cores = os.cpu_count()
    print(f"\n{a.measure_model}, batch {a.batch} x {a.seq}, bf16, {a.max_steps} steps, "
          f"{cpu_name()}, {cores} cores")
    print("| layout | samples/s | loss | planned / rank | rank 0's peak RSS "
          "| summed / step (estimate) | gathered and reduce-scattered / step (estimate) "
          "| communication's share of the run |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    runs = ((1, cores, (), "tp 1"), (2, max(1, cores // 2), (), "tp 2, sequence parallel"),
            (2, max(1, cores // 2), WHOLE_TOKENS, "tp 2, every token"))
    for tp, threads, extra, name in runs:
        r = layout_train("tp_size", tp, threads, a.measure_model, a.batch, a.seq, a.max_steps,
                         os.path.join(tmp, f"tp{tp}{''.join(extra)}"), extra)
        mem = r["memory"]
        planned = sum(mem["planned_bytes"].values())
        summed = r.get("tensor_parallel_sum_bytes", 0) / a.max_steps
        tokens = r.get("tensor_parallel_token_bytes", 0) / a.max_steps
        j, _ = layout_estimate("tp_size", tp, a.measure_model, a.batch, a.seq, tmp, extra)
        plan = j.get("tensor_parallel", {}) if j else {}
        print(f"| {name} ({tp} x {threads} threads) | {r['train_samples_per_second']:.2f} "
              f"| {r['train_loss']:.4f} | {planned / MIB:.0f} MiB "
              f"| {mem['peak_rss_bytes'] / MIB:.0f} MiB "
              f"| {summed / MIB:.1f} MiB ({plan.get('sums_bytes_per_step', 0) / MIB:.1f}) "
              f"| {tokens / MIB:.1f} MiB "
              f"({plan.get('gathered_and_scattered_bytes_per_step', 0) / MIB:.1f}) "
              f"| {r['communication_seconds'] / r['train_runtime']:.0%} |")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--measure_model", default="gpt2")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--max_steps", type=int, default=8)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print("With Megatron's sequence parallelism (the default):")
        layout_plan_table("tp_size", "tp", "per layer (Megatron, flash)",
                          megatron_sequence_parallel_bytes, tmp)
        print("\nEvery token on every rank (--tp_sequence_parallel false):")
        layout_plan_table("tp_size", "tp", "per layer (Megatron, flash)", megatron_layer_bytes,
                          tmp, WHOLE_TOKENS)
        measured_table(a, tmp)


if __name__ == "__main__":
    main()
