#!/usr/bin/env python3
"""GPU benchmark of offload_optimizer cpu (ZeRO-Offload on one GPU): GPT-2 124M and a GPT-2 XL
configuration (1.56B parameters, random init) in bf16 at sequence 1024, trained by brisk with the
optimizer on the GPU, by brisk with the optimizer offloaded to the host, and by PyTorch +
transformers' Trainer (no offload: DeepSpeed is not installed on the GPU machine). Prints
samples/s, "GPU memory occupied" (NVML, read by each run at its end, CUDA context included), what
`brisk estimate --device cuda` expected of it before the run, and brisk's peak host memory.

Run on a machine with an NVIDIA GPU (torch and transformers installed; BRISK_BIN as in
gpu_bert.py):
    python bench/gpu_offload.py [--steps 12] [--only gpt2,gpt2-xl]
"""
import argparse
import json
import os
import subprocess
import tempfile

from gpu_bert import BRISK, GPT2, run_brisk, run_hf, write_config, write_tokens

GPT2_XL = dict(GPT2, n_embd=1600, n_layer=48, n_head=25)
MODELS = {"gpt2": (GPT2, 8), "gpt2-xl": (GPT2_XL, 4)}  # config, per-device batch
SEQ = 1024


def expected_gpu_bytes(cfg_dir, opts):
    """What brisk estimate expects of "GPU memory occupied": the device plan + the fixed part."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "e.json")
        cmd = [BRISK, "estimate", "--device", "cuda", "--model", cfg_dir, "--seq_len", str(SEQ),
               "--output_json", out]
        for k, v in opts.items():
            cmd += [f"--{k}", ("true" if v else "false") if isinstance(v, bool) else str(v)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            return None
        with open(out) as f:
            m = json.load(f)["memory"]
        return m["planned_device_bytes"] + m["device_context_bytes"], m["planned_host_bytes"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--only", default="gpt2,gpt2-xl")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.only.split(","):
            cfg, batch = MODELS[name]
            folder = write_config(os.path.join(tmp, name), cfg)
            samples = a.steps * batch
            tokens = os.path.join(tmp, name + ".bin")
            write_tokens(tokens, samples * SEQ + 1)
            base = {"per_device_train_batch_size": batch, "bf16": True}
            for run, opts in (("brisk", base), ("brisk offload", dict(base, offload_optimizer="cpu"))):
                r = run_brisk(folder, os.path.join(tmp, "b"), "lm", samples, SEQ, opts, tokens)
                r["expected"] = expected_gpu_bytes(folder, opts)
                rows.append((name, run, r))
                print(json.dumps({"model": name, "run": run, **r}), flush=True)
            h = run_hf(folder, os.path.join(tmp, "h"), "lm", samples, SEQ, base)
            rows.append((name, "Trainer", h))
            print(json.dumps({"model": name, "run": "Trainer", **h}), flush=True)

    mib = lambda x: f"{x / 2**20:.0f} MiB" if x else "n/a"
    print(f"{'model':<9}{'run':<15}{'samples/s':>10}{'GPU memory':>12}{'estimate':>12}"
          f"{'host plan':>12}{'peak RSS':>12}")
    for name, run, r in rows:
        if "error" in r:
            print(f"{name:<9}{run:<15} error: {r['error']}")
            continue
        exp = r.get("expected") or (None, None)
        print(f"{name:<9}{run:<15}{r['samples_per_second']:>10.2f}{mib(r['gpu_memory']):>12}"
              f"{mib(exp[0]):>12}{mib(exp[1]):>12}{mib(r.get('peak_rss')):>12}")


if __name__ == "__main__":
    main()
