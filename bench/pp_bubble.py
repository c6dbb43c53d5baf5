"""Pipeline parallelism on this machine's cores: `brisk train --pp_size p` under mpirun (one thread
per stage) for several micro-batch counts m (gradient_accumulation_steps), the bubble the run
measures (the share of the stages' time spent waiting, pipeline_bubble_share in its log) next to
1F1B's (p - 1) / (m + p - 1) for stages that take as long; the bytes rank 0 (the first stage)
sends per step next to the formula m B T C x 4 (each micro-batch's output, float32); and the step
speed, the planned bytes and rank 0's peak against one process with every thread on the same
global batch. First, each stage's plan (`brisk estimate --pp_size p`) for GPT-2 124M and a Llama
with 7B's shape.

Stages before the last run each micro-batch's forward again just before its backward (they keep
only its input), so the first stage works F + F + B where the last works F + B: the measured
bubble includes that imbalance, and the last stage's LM head.

    python3 bench/pp_bubble.py [--model gpt2] [--stages 2] [--max_steps 4]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

from common import cpu_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BRISK = os.environ.get("BRISK_BIN", os.path.join(ROOT, "build", "brisk"))
MIB = 2**20
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_btl_vader_single_copy_mechanism="none")
HIDDEN = {"gpt2": 768, "gpt2-tiny": 64}


def train(a, stages, micro, threads, out):
    """The run's train_results.json and its logged steps."""
    args = [BRISK, "train", "--model_name_or_path", a.model, "--pp_size", str(stages),
            "--per_device_train_batch_size", str(a.batch), "--seq_len", str(a.seq),
            "--gradient_accumulation_steps", str(micro), "--max_steps", str(a.max_steps),
            "--logging_steps", "1", "--output_dir", out, "--disable_tqdm", "true",
            "--save_strategy", "no", "--dataset_size", str(a.batch * micro * a.max_steps)]
    env = dict(ENV, OMP_NUM_THREADS=str(threads))
    if stages > 1:
        args = ["mpirun", "-np", str(stages), "--oversubscribe", "--bind-to", "none"] + args
    r = subprocess.run(args, check=True, env=env, capture_output=True, text=True)
    steps = [json.loads(line) for line in (r.stdout + r.stderr).splitlines()
             if line.startswith("{") and '"loss"' in line and '"step"' in line]
    return json.load(open(os.path.join(out, "train_results.json"))), steps


# name, batch, sequence, pipeline degrees
SHAPES = [("gpt2", 4, 1024, (1, 2, 4)), ("llama-2-7b", 1, 4096, (1, 2, 4, 8))]


def plan_table(tmp):
    """Each stage's plan from `brisk estimate --pp_size p --bf16` (8 micro-batches)."""
    print("| model | pp | stage 0 | a middle stage | last stage | largest against pp 1 |")
    print("|---|---:|---:|---:|---:|---:|")
    for model, batch, seq, degrees in SHAPES:
        whole = None
        for pp in degrees:
            out = os.path.join(tmp, f"{model}_pp{pp}.json")
            subprocess.run([BRISK, "estimate", "--model_name_or_path", model, "--pp_size", str(pp),
                            "--world_size", str(pp), "--per_device_train_batch_size", str(batch),
                            "--seq_len", str(seq), "--gradient_accumulation_steps", "8",
                            "--bf16", "--output_json", out], check=True, capture_output=True)
            j = json.load(open(out))
            stages = j["pipeline_stages"] or [{"planned_total_bytes":
                                               j["memory"]["planned_total_bytes"]}]
            totals = [st["planned_total_bytes"] for st in stages]
            whole = whole or totals[0]
            middle = f"{totals[1] / MIB:.0f} MiB" if len(totals) > 2 else "-"
            print(f"| {model} b{batch} s{seq} | {pp} | {totals[0] / MIB:.0f} MiB | {middle} "
                  f"| {totals[-1] / MIB:.0f} MiB | {max(totals) / whole:.2f} |")


def bubble_table(a, tmp):
    p = a.stages
    print(f"{a.model}, batch {a.batch} x {a.seq} per micro-batch, float32, pp {p} "
          f"({p} ranks x 1 thread), {cpu_name()}, {os.cpu_count()} cores")
    print("| micro-batches m | measured bubble (median of steps 2..) | (p - 1) / (m + p - 1) "
          "| rank 0 sent / step | m B T C x 4 |")
    print("|---:|---:|---:|---:|---:|")
    for m in a.micro:
        _, steps = train(a, p, m, 1, os.path.join(tmp, f"pp{p}_m{m}"))
        later = steps[1:] or steps
        bubble = statistics.median(s["pipeline_bubble_share"] for s in later)
        sent = statistics.median(s["pipeline_sent_bytes"] for s in later)
        formula = m * a.batch * a.seq * HIDDEN[a.model] * 4
        print(f"| {m} | {bubble:.1%} | {(p - 1) / (m + p - 1):.1%} | {sent / MIB:.2f} MiB "
              f"| {formula / MIB:.2f} MiB |")


def memory_table(a, tmp):
    cores = os.cpu_count()
    m = max(a.micro)
    print(f"\nThe same global batch ({m} micro-batches of {a.batch} x {a.seq}), one process "
          f"against pp {a.stages}:")
    print("| layout | samples/s | loss | planned (rank 0) | weights + grads + optimizer (rank 0) "
          "| rank 0's peak RSS |")
    print("|---|---:|---:|---:|---:|---:|")
    for stages, threads in ((1, cores), (a.stages, max(1, cores // a.stages))):
        r, _ = train(a, stages, m, threads, os.path.join(tmp, f"mem{stages}"))
        mem = r["memory"]
        planned = mem["planned_bytes"]
        states = sum(planned[k] for k in ("weights", "master_weights", "gradients",
                                          "optimizer_state") if k in planned)
        print(f"| pp {stages} ({stages} x {threads} threads) "
              f"| {r['train_samples_per_second']:.2f} | {r['train_loss']:.4f} "
              f"| {sum(planned.values()) / MIB:.0f} MiB | {states / MIB:.0f} MiB "
              f"| {mem['peak_rss_bytes'] / MIB:.0f} MiB |")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="gpt2", choices=sorted(HIDDEN))
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--micro", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--max_steps", type=int, default=4)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        plan_table(tmp)
        print()
        bubble_table(a, tmp)
        memory_table(a, tmp)


if __name__ == "__main__":
    main()
