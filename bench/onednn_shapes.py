#!/usr/bin/env python3
"""Where a brisk training step's matrix products go, per shape: runs brisk on one of
bench/cpu_speed.py's workloads with oneDNN's verbose timing (ONEDNN_VERBOSE=2) and sums each
primitive's time per kernel and shape, per step, with its rate in GFLOP/s. Products by OpenBLAS
(float32 where oneDNN does not take them) and brisk's own attention tiles do not show up.

    python3 bench/onednn_shapes.py [--row smollm2] [--precision bf16] [--steps 6] [--top 20]
                                   [--brisk build/brisk]

The times include the first step (where oneDNN makes its kernels); the rates are those of the
calls as they ran inside the step, operands in or out of cache as the step leaves them.
"""
import argparse
import collections
import os
import subprocess
import tempfile

from cpu_speed import BRISK, MODELS, brisk_command, write_config


def product_flops(shapes):
    """2 M N K (times any batch dimensions) from oneDNN's "MxK:KxN:MxN" problem description."""
    a, b = shapes.split(":")[:2]
    a = [int(x) for x in a.split("x")]
    b = [int(x) for x in b.split("x")]
    flops = 2 * a[-2] * a[-1] * b[-1]
    for x in a[:-2]:
        flops *= x
    return flops


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--row", default="smollm2", choices=sorted(MODELS))
    p.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--brisk", default=BRISK)
    a = p.parse_args()
    m = MODELS[a.row]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = brisk_command(write_config(tmp, a.row), os.path.join(tmp, "out"), a.precision, m,
                            a.steps, os.path.abspath(a.brisk))
        log = subprocess.run(cmd, check=True, capture_output=True, text=True,
                             env=dict(os.environ, ONEDNN_VERBOSE="2")).stdout
    ms = collections.defaultdict(float)
    calls = collections.Counter()
    for line in log.splitlines():
        # onednn_verbose,exec,cpu,matmul,<kernel>,...,<problem>,<milliseconds>
        f = line.split(",")
        if len(f) < 6 or f[0] != "onednn_verbose" or f[1] != "exec" or f[3] != "matmul":
            continue
        key = (f[4], f[-2])
        ms[key] += float(f[-1])
        calls[key] += 1
    if not ms:
        raise SystemExit("no oneDNN products in the log: this run's products are OpenBLAS's")
    print(f"{a.row} {a.precision}, {a.steps} steps: {sum(ms.values()) / a.steps:.1f} ms of oneDNN "
          f"products a step")
    print("| ms/step | calls/step | GFLOP/s | kernel | M x K : K x N |")
    print("|---|---|---|---|---|")
    for key, t in sorted(ms.items(), key=lambda kv: -kv[1])[:a.top]:
        rate = product_flops(key[1]) * calls[key] / (t * 1e-3) / 1e9
        print(f"| {t / a.steps:.1f} | {calls[key] / a.steps:.0f} | {rate:.0f} | {key[0]} | "
              f"{key[1]} |")


if __name__ == "__main__":
    main()
