#!/usr/bin/env python3
"""The GPU memory brisk plans for the anchor rows of bench/gpu_anchors.py (bert-large 512 at batch
4/16/32, GPT-2 124M 1024 at batch 8/16/32, the TinyLlama shape 2048 at batch 4/8; bf16, AdamW),
by `brisk estimate --device cuda`, which needs no GPU: the planned device bytes plus the GPU
context brisk assumes (what "GPU memory occupied" should read), for this build and, where
$BRISK_BASE_BIN names another, that build, beside the GPU memory transformers' Trainer held in
the same rows when last measured (H100, 2026-11-26: docs/benchmarks.md, "With the Trainer").

    python bench/gpu_plan_memory.py [--json rows.json] [--eval]

--eval plans runs that only evaluate (--do_train false --do_eval, the batch as the evaluation
batch); the Trainer's column then stays empty (not measured).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from gpu_anchors import BATCHES, CONFIGS, SEQ
from gpu_bert import BRISK, write_config

# GiB of GPU memory transformers' Trainer held (bf16, adamw_torch_fused, sdpa), measured on an
# H100 80GB on 2026-11-26 by bench/gpu_anchors.py (docs/benchmarks.md); none for the Llama shape.
TRAINER_H100_GIB = {("bert", 4): 7.20, ("bert", 16): 13.34, ("bert", 32): 21.53,
                    ("gpt2", 8): 14.55, ("gpt2", 16): 24.49, ("gpt2", 32): 47.77}


def planned(binary, cfg, model, batch, tmp, evaluates):
    out = os.path.join(tmp, "estimate.json")
    cmd = [binary, "estimate", "--device", "cuda", "--model", cfg, "--seq_len", str(SEQ[model]),
           "--per_device_train_batch_size", str(batch), "--bf16", "true", "--output_json", out]
    if evaluates:
        cmd += ["--do_train", "false", "--do_eval", "--per_device_eval_batch_size", str(batch)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{binary}: {(p.stderr or p.stdout).strip()}")
    with open(out) as f:
        m = json.load(f)["memory"]
    return {"gib": (m["planned_device_bytes"] + m["device_context_bytes"]) / 2**30,
            "master": m["planned_bytes"]["master_weights"] / 2**30,
            "weights": m["planned_bytes"]["weights"] / 2**30}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="", help="also write the rows to this file")
    ap.add_argument("--eval", action="store_true", help="runs that only evaluate")
    a = ap.parse_args()
    base = os.environ.get("BRISK_BASE_BIN", "")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model, config in CONFIGS.items():
            cfg = write_config(os.path.join(tmp, model), config)
            for batch in BATCHES[model]:
                row = {"model": model, "batch": batch,
                       "brisk": planned(BRISK, cfg, model, batch, tmp, a.eval),
                       "trainer_gib": None if a.eval else TRAINER_H100_GIB.get((model, batch))}
                if base:
                    row["base"] = planned(base, cfg, model, batch, tmp, a.eval)
                rows.append(row)
    head = "| model | batch | brisk GiB (weights, master) |"
    head += " base GiB (weights, master) |" if base else ""
    print(head + " Trainer GiB (H100) | brisk / Trainer |")
    print("|---" * (5 + bool(base)) + "|")
    for r in rows:
        cells = [r["model"], str(r["batch"])]
        for key in ["brisk"] + (["base"] if base else []):
            p = r[key]
            cells.append(f"{p['gib']:.2f} ({p['weights']:.2f}, {p['master']:.2f})")
        t = r["trainer_gib"]
        cells += [f"{t:.2f}" if t else "-", f"{r['brisk']['gib'] / t:.2f}x" if t else "-"]
        print("| " + " | ".join(cells) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
