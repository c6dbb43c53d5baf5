#!/usr/bin/env python3
"""GPU benchmark: the Hugging Face guides' experiment (bert-large-uncased configuration, random init, sequence
classification, 512 random sequences of length 512, one epoch) trained by brisk and by PyTorch +
transformers' Trainer on the same GPU, one row per technique of the guides' table (including
their Adafactor and 8-bit Adam rows) plus bf16 and tf32, and GPT-2 124M causal LM at sequence
1024. Prints samples/s, "GPU memory occupied" (NVML
via nvidia-smi, read by each run at its end, as the guides' print_gpu_utilization does) and the
ratios brisk / Trainer.

Run on a machine with an NVIDIA GPU (after scripts/build.sh; torch and transformers installed):
    python bench/gpu_bert.py [--samples 512] [--rows all|quick]
MFU (GPT-2 and bf16 BERT rows): tokens/s x (6 N + 12 L C T) / peak, with N the non-embedding
parameters, L layers, C hidden size, T sequence length (the forward + backward matmul FLOPs of
the parameters and of attention's QK^T and PV), peak = the GPU's dense bf16 tensor FLOP/s
(--peak_tflops, 989 for H100 SXM).
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BRISK = os.environ.get("BRISK_BIN", os.path.join(ROOT, "build", "brisk"))

BERT_LARGE = {"model_type": "bert", "vocab_size": 30522, "hidden_size": 1024,
              "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096,
              "max_position_embeddings": 512, "type_vocab_size": 2, "hidden_act": "gelu",
              "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
              "layer_norm_eps": 1e-12, "id2label": {"0": "LABEL_0", "1": "LABEL_1"},
              "label2id": {"LABEL_0": 0, "LABEL_1": 1}}
GPT2 = {"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, "n_embd": 768,
        "n_layer": 12, "n_head": 12, "activation_function": "gelu_new", "resid_pdrop": 0.1,
        "embd_pdrop": 0.1, "attn_pdrop": 0.1, "layer_norm_epsilon": 1e-5}

# (name, options) as TrainingArguments names; the guides' table first.
BERT_ROWS = [
    ("batch 4", {"per_device_train_batch_size": 4}),
    ("batch 1 x accum 4", {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4}),
    ("+ gradient checkpointing", {"per_device_train_batch_size": 1,
                                  "gradient_accumulation_steps": 4,
                                  "gradient_checkpointing": True}),
    ("batch 4 fp16", {"per_device_train_batch_size": 4, "fp16": True}),
    ("batch 1 x 4 + ckpt + fp16", {"per_device_train_batch_size": 1,
                                   "gradient_accumulation_steps": 4,
                                   "gradient_checkpointing": True, "fp16": True}),
    ("batch 4 adafactor", {"per_device_train_batch_size": 4, "optim": "adafactor"}),
    ("batch 1 x 4 + ckpt + fp16 + adafactor", {"per_device_train_batch_size": 1,
                                               "gradient_accumulation_steps": 4,
                                               "gradient_checkpointing": True, "fp16": True,
                                               "optim": "adafactor"}),
    # The guides pass bitsandbytes' Adam8bit by hand; Trainer's optim flag does the same today
    # (the PyTorch side needs bitsandbytes installed).
    ("batch 4 8-bit adam", {"per_device_train_batch_size": 4, "optim": "adamw_bnb_8bit"}),
    ("batch 1 x 4 + ckpt + fp16 + 8-bit", {"per_device_train_batch_size": 1,
                                           "gradient_accumulation_steps": 4,
                                           "gradient_checkpointing": True, "fp16": True,
                                           "optim": "adamw_bnb_8bit"}),
    ("batch 4 bf16", {"per_device_train_batch_size": 4, "bf16": True}),
    ("batch 4 tf32", {"per_device_train_batch_size": 4, "tf32": True}),
]
QUICK_ROWS = ("batch 4", "batch 4 adafactor", "batch 4 8-bit adam", "batch 4 bf16")

HF_CHILD = r'''
import json, subprocess, sys, time
import numpy as np, torch
from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification,
                          Trainer, TrainingArguments, logging)
logging.set_verbosity_error()
cfg_dir, out_dir, kind, samples, seq, opts = sys.argv[1:7]
samples, seq, opts = int(samples), int(seq), json.loads(opts)
torch.manual_seed(42)
config = AutoConfig.from_pretrained(cfg_dir)
if kind == "lm":
    model = AutoModelForCausalLM.from_config(config)
else:
    model = AutoModelForSequenceClassification.from_config(config)
rng = np.random.default_rng(0)
ids = rng.integers(100, 30000, (samples, seq))
labels = np.zeros((samples,), dtype=np.int64)   # the guides' randint(0, 1)
class DS(torch.utils.data.Dataset):
    def __len__(self): return samples
    def __getitem__(self, i):
        x = torch.tensor(ids[i])
        return {"input_ids": x, "labels": x.clone() if kind == "lm" else torch.tensor(labels[i])}
args = TrainingArguments(output_dir=out_dir, num_train_epochs=1, report_to="none",
                         save_strategy="no", logging_strategy="no", disable_tqdm=True,
                         dataloader_num_workers=0, **opts)
result = Trainer(model=model, args=args, train_dataset=DS()).train()
used = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                       "-i", "0"], capture_output=True, text=True).stdout.split()[0]
print(json.dumps({"samples_per_second": result.metrics["train_samples_per_second"],
                  "gpu_memory": int(used) * 2**20}))
'''


def write_config(folder, config):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return folder


def write_tokens(path, count, seed=0):
    """A brisk token file (magic, version 1, 4 bytes per token, count) of random ids."""
    import random
    rnd = random.Random(seed)
    with open(path, "wb") as f:
        f.write(b"BRISKTOK" + struct.pack("<IIQ", 1, 4, count))
        f.write(struct.pack(f"<{count}I", *(rnd.randrange(100, 30000) for _ in range(count))))


def run_brisk(cfg_dir, out_dir, kind, samples, seq, opts, dataset=None):
    cmd = [BRISK, "train", "--device", "cuda", "--model", cfg_dir, "--seq_len", str(seq),
           "--num_train_epochs", "1", "--logging_steps", "1000000", "--save_strategy", "no",
           "--output_dir", out_dir, "--disable_tqdm", "true"]
    cmd += ["--dataset", dataset] if dataset else ["--dataset_size", str(samples)]
    for k, v in opts.items():
        cmd += [f"--{k}", ("true" if v else "false") if isinstance(v, bool) else str(v)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip().splitlines()[-1][:60]}
    with open(os.path.join(out_dir, "train_results.json")) as f:
        r = json.load(f)
    return {"samples_per_second": r["train_samples_per_second"],
            "gpu_memory": r["memory"]["device_memory_used_bytes"],
            "peak_rss": r["memory"]["peak_rss_bytes"]}


def run_hf(cfg_dir, out_dir, kind, samples, seq, opts):
    p = subprocess.run([sys.executable, "-c", HF_CHILD, cfg_dir, out_dir, kind, str(samples),
                        str(seq), json.dumps(opts)], capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": p.stderr.strip().splitlines()[-1][:60] if p.stderr else "failed"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def flops_per_token(c, seq):
    L, C = c.get("num_hidden_layers", c.get("n_layer")), c.get("hidden_size", c.get("n_embd"))
    inner = c.get("intermediate_size", 4 * C)
    heads = c.get("num_attention_heads", c.get("n_head"))
    kv = c.get("num_key_value_heads", heads) * C // heads  # key and value widths (GQA)
    gated = 3 if c.get("model_type") in ("llama", "mistral", "qwen2") else 2  # gate, up, down
    n = L * (2 * C * C + 2 * C * kv + gated * C * inner)  # non-embedding matmul parameters
    return 6 * n + 12 * L * C * seq


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--rows", default="all", choices=["all", "quick"])
    ap.add_argument("--peak_tflops", type=float, default=989.0)
    ap.add_argument("--only", default="", help="comma-separated row names to run (default: --rows)")
    ap.add_argument("--no_gpt2", action="store_true", help="skip the GPT-2 row")
    a = ap.parse_args()
    rows = BERT_ROWS if a.rows == "all" else [r for r in BERT_ROWS if r[0] in QUICK_ROWS]
    if a.only:
        rows = [r for r in BERT_ROWS if r[0] in a.only.split(",")]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        bert = write_config(os.path.join(tmp, "bert"), BERT_LARGE)
        for name, opts in rows:
            b = run_brisk(bert, os.path.join(tmp, "b"), "cls", a.samples, 512, opts)
            h = run_hf(bert, os.path.join(tmp, "h"), "cls", a.samples, 512, opts)
            results.append(("bert-large " + name, 512, BERT_LARGE, opts, b, h))
            print(json.dumps({"row": name, "brisk": b, "hf": h}), flush=True)
        if not a.no_gpt2:
            gpt2 = write_config(os.path.join(tmp, "gpt2"), GPT2)
            tokens = os.path.join(tmp, "tokens.bin")
            gpt_samples = max(64, a.samples // 4)
            write_tokens(tokens, gpt_samples * 1024 + 1)
            opts = {"per_device_train_batch_size": 8, "bf16": True}
            b = run_brisk(gpt2, os.path.join(tmp, "gb"), "lm", gpt_samples, 1024, opts, tokens)
            h = run_hf(gpt2, os.path.join(tmp, "gh"), "lm", gpt_samples, 1024, opts)
            results.append(("gpt2-124M bf16 batch 8", 1024, GPT2, opts, b, h))
            print(json.dumps({"row": "gpt2", "brisk": b, "hf": h}), flush=True)

    gib = lambda x: f"{x / 2**30:.2f} GiB" if x and x > 0 else "n/a"
    print(f"{'row':<40}{'brisk/s':>9}{'HF/s':>9}{'speed x':>9}{'brisk mem':>11}{'HF mem':>11}"
          f"{'mem x':>7}{'MFU b/HF':>12}")
    ratios = []
    for name, seq, cfg, opts, b, h in results:
        if "error" in b or "error" in h:
            print(f"{name:<40} brisk: {b.get('error', 'ok')} | HF: {h.get('error', 'ok')}")
            continue
        s = b["samples_per_second"] / h["samples_per_second"]
        ratios.append(s)
        m = b["gpu_memory"] / h["gpu_memory"] if b["gpu_memory"] > 0 else float("nan")
        mfu = ""
        if opts.get("bf16"):
            f = flops_per_token(cfg, seq) * seq / (a.peak_tflops * 1e12)
            mfu = f"{100 * b['samples_per_second'] * f:.0f}%/{100 * h['samples_per_second'] * f:.0f}%"
        print(f"{name:<40}{b['samples_per_second']:>9.2f}{h['samples_per_second']:>9.2f}{s:>9.2f}"
              f"{gib(b['gpu_memory']):>11}{gib(h['gpu_memory']):>11}{m:>7.2f}{mfu:>12}")
    if ratios:
        geo = 1.0
        for r in ratios:
            geo *= r
        print(f"geometric mean speed ratio: {geo ** (1 / len(ratios)):.2f} over {len(ratios)} rows;"
              f" lowest {min(ratios):.2f}")


if __name__ == "__main__":
    main()
