#!/usr/bin/env python3
"""Before/after speed of two brisk binaries on one of bench/cpu_speed.py's workloads, alternating
them (this machine's speed drifts 3-10% over minutes, so runs of one binary and then the other
would measure the drift). Prints each run's samples/s (brisk's whole run, as cpu_speed.py) and the
mean gain of AFTER over BEFORE.

    python3 bench/cpu_ab.py BEFORE_BIN AFTER_BIN [--row gpt2] [--precision bf16|fp32|fp16] [--pairs 3]
                            [--steps 8] [--optim adamw_torch]

BEFORE_BIN is typically a build of the commit before a change, e.g. from a worktree:
    git worktree add /tmp/before HEAD~1 && (cd /tmp/before && scripts/build.sh)
or the same binary with a measurement switch set for the BEFORE runs:
    python3 bench/cpu_ab.py build/brisk build/brisk --before-env BRISK_FUSED_RESIDUAL_NORM=0
"""
import argparse
import os
import tempfile

from common import cpu_name
from cpu_speed import MODELS, run_brisk, write_config


def main():
    p = argparse.ArgumentParser()
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--row", default="gpt2", choices=sorted(MODELS))
    p.add_argument("--precision", default="bf16", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=0, help="steps per run (default: cpu_speed's)")
    p.add_argument("--optim", default="adamw_torch", help="brisk's --optim (default adamw_torch)")
    p.add_argument("--before-env", action="append", default=[], metavar="NAME=VALUE",
                   help="an environment variable set for the BEFORE runs only (repeatable)")
    a = p.parse_args()
    before_env = dict(kv.split("=", 1) for kv in a.before_env)
    m = MODELS[a.row]
    steps = a.steps or m["steps"]
    print(f"cpu: {cpu_name()}", flush=True)
    runs = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        cfg_dir = write_config(tmp, a.row)
        for pair in range(a.pairs):
            for name, binary in (("before", a.before), ("after", a.after)):
                r = run_brisk(cfg_dir, os.path.join(tmp, f"{name}-{pair}"), a.precision, m, steps,
                              os.path.abspath(binary), a.optim,
                              before_env if name == "before" else None)
                runs[name].append(r["samples_per_second"])
                print(f"{a.row} {a.precision} {a.optim} pair {pair + 1} {name}: "
                      f"{r['samples_per_second']:.3f} samples/s, "
                      f"{r['peak_rss'] / 2**20:.0f} MiB", flush=True)
    before = sum(runs["before"]) / len(runs["before"])
    after = sum(runs["after"]) / len(runs["after"])
    print(f"mean {before:.3f} -> {after:.3f} samples/s ({100 * (after / before - 1):+.1f}%)")


if __name__ == "__main__":
    main()
