#!/usr/bin/env python3
"""A GPT-2-architecture model trained from scratch on the King James Bible (data/ from
scripts/get_data.sh) with the real GPT-2 tokenizer, as run_clm does it, by brisk, by
transformers' Trainer and by a plain PyTorch loop, with the same data and settings: every line
with its line break tokenized, grouped per 1000 lines into blocks of 128 (the remainder of each
group dropped), the first 5% of the lines for validation; 6 layers, hidden 384, 6 heads,
n_positions 128; batch 8, AdamW, lr 5e-4 with linear decay, dropout 0 (so the three compute the
same function), seed 42, the same initial weights (brisk's, saved once and loaded by the others).
Prints eval loss at the same step, train samples/s and peak process memory.

Run (after scripts/build.sh, scripts/setup_python.sh and scripts/get_data.sh):
    .venv/bin/python bench/clm_kjv.py [--max_steps 60] [--only brisk,trainer,torch]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from common import RUN_CLM_BLOCKS, cpu_name, run_child

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BRISK = os.environ.get("BRISK_BIN", os.path.join(ROOT, "build", "brisk"))
DATA = os.path.join(ROOT, "data")
TOKENIZER = os.path.join(DATA, "gpt2-tokenizer")
TEXT = os.path.join(DATA, "kjv", "kjv.txt")

CONFIG = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 50257,
          "n_embd": 384, "n_layer": 6, "n_head": 6, "n_positions": 128, "n_inner": None,
          "activation_function": "gelu_new", "resid_pdrop": 0.0, "embd_pdrop": 0.0,
          "attn_pdrop": 0.0, "layer_norm_epsilon": 1e-5, "initializer_range": 0.02,
          "bos_token_id": 50256, "eos_token_id": 50256}

PY_CHILD = r'''
import json, resource, sys, time
import torch
from transformers import (GPT2LMHeadModel, GPT2TokenizerFast, Trainer, TrainingArguments,
                          default_data_collator, get_linear_schedule_with_warmup, logging)
logging.set_verbosity_error()
mode, model_dir, tok_dir, text, out_dir, max_steps, batch, block, lr = sys.argv[1:10]
max_steps, batch, block, lr = int(max_steps), int(batch), int(block), float(lr)
torch.manual_seed(42)
tok = GPT2TokenizerFast.from_pretrained(tok_dir)
''' + RUN_CLM_BLOCKS + r'''
train_ds, dev_ds = blocks(lines[cut:]), blocks(lines[:cut])
model = GPT2LMHeadModel.from_pretrained(model_dir)
def eval_loss():  # the mean over all predicted tokens (block - 1 per block), as brisk reports it
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for b in torch.utils.data.DataLoader(dev_ds, batch_size=batch,
                                             collate_fn=default_data_collator):
            total += model(**b).loss.item() * len(b["labels"]); count += len(b["labels"])
    return total / count
if mode == "trainer":
    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=batch,
                             per_device_eval_batch_size=batch, learning_rate=lr,
                             max_steps=max_steps, report_to="none", save_strategy="no",
                             logging_strategy="no", eval_strategy="no", use_cpu=True,
                             dataloader_num_workers=0, disable_tqdm=True, seed=42)
    trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=dev_ds,
                      data_collator=default_data_collator)
    result = trainer.train()
    # Trainer.evaluate() divides the summed loss by every label (block per block, the shift not
    # counted), 127/128 of the per-prediction mean: the loss is measured as the others measure it.
    out = {"samples_per_second": result.metrics["train_samples_per_second"],
           "eval_loss": eval_loss(), "trainer_reported_eval_loss": trainer.evaluate()["eval_loss"]}
else:  # a plain PyTorch loop over the same blocks
    g = torch.Generator().manual_seed(42)
    loader = torch.utils.data.DataLoader(train_ds, batch_size=batch, shuffle=True, generator=g,
                                         collate_fn=default_data_collator)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = get_linear_schedule_with_warmup(opt, 0, max_steps)
    model.train()
    done, samples, start = 0, 0, time.perf_counter()
    while done < max_steps:
        for b in loader:
            model(**b).loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step(); sched.step(); opt.zero_grad()
            done += 1; samples += len(b["labels"])
            if done == max_steps: break
    secs = time.perf_counter() - start
    out = {"samples_per_second": samples / secs, "eval_loss": eval_loss()}
out["blocks"] = [len(train_ds), len(dev_ds)]
out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps(out))
'''


def brisk_cmd(model, out_dir, a, steps):
    return [BRISK, "train", "--model", model, "--tokenizer_name", TOKENIZER, "--train_file", TEXT,
            "--block_size", str(a.block), "--validation_split_percentage", "5",
            "--per_device_train_batch_size", str(a.batch),
            "--per_device_eval_batch_size", str(a.batch), "--learning_rate", str(a.lr),
            "--max_steps", str(steps), "--do_eval", "--save_strategy", "no",
            "--logging_steps", "1000", "--seed", "42", "--output_dir", out_dir,
            "--disable_tqdm", "--device", "cpu"]


def initial_weights(tmp, a):
    """A model folder with brisk's initial weights (a 0-step-like run: 1 step at lr 0)."""
    cfg_dir = os.path.join(tmp, "config")
    os.makedirs(cfg_dir, exist_ok=True)
    with open(os.path.join(cfg_dir, "config.json"), "w") as f:
        json.dump(CONFIG, f)
    out = os.path.join(tmp, "init")
    cmd = brisk_cmd(cfg_dir, out, a, 1)
    cmd[cmd.index("--learning_rate") + 1] = "0"
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out  # model.safetensors, config.json and the tokenizer files


def run_brisk(model, out_dir, a):
    subprocess.run(brisk_cmd(model, out_dir, a, a.max_steps), check=True,
                   stdout=subprocess.DEVNULL)
    train = json.load(open(os.path.join(out_dir, "train_results.json")))
    ev = json.load(open(os.path.join(out_dir, "eval_results.json")))
    return {"samples_per_second": train["train_samples_per_second"],
            "eval_loss": ev["eval_loss"], "peak_rss": train["memory"]["peak_rss_bytes"]}


def run_python(mode, model, out_dir, a):
    return run_child(PY_CHILD, mode, model, TOKENIZER, TEXT, out_dir, a.max_steps, a.batch, a.block,
                     a.lr)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--max_steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--only", default="brisk,trainer,torch")
    a = p.parse_args()
    for path in (TOKENIZER, TEXT):
        if not os.path.exists(path):
            sys.exit(f"{path} is missing: run scripts/get_data.sh")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = initial_weights(tmp, a)
        for name in a.only.split(","):
            out = os.path.join(tmp, name)
            results[name] = (run_brisk(model, out, a) if name == "brisk"
                             else run_python(name, model, out, a))
            print(name, json.dumps(results[name]), flush=True)
    cpu = cpu_name()
    print(f"\nGPT-2 6x384 from scratch on the KJV text ({a.max_steps} steps, batch {a.batch}, "
          f"block_size {a.block}, lr {a.lr}); CPU: {cpu}, {os.cpu_count()} threads")
    print("| run | eval loss | train samples/s | peak process memory |")
    print("|---|---|---|---|")
    base = results.get("trainer")
    for name, r in results.items():
        loss = f"{r['eval_loss']:.4f}"
        sps = f"{r['samples_per_second']:.2f}"
        mem = f"{r['peak_rss'] / 2**20:.0f} MiB"
        if base and name != "trainer":
            loss += f" ({100 * (r['eval_loss'] / base['eval_loss'] - 1):+.2f}% vs Trainer)"
            sps += f" ({r['samples_per_second'] / base['samples_per_second']:.2f}x)"
            mem += f" ({r['peak_rss'] / base['peak_rss']:.2f}x)"
        print(f"| {name} | {loss} | {sps} | {mem} |")


if __name__ == "__main__":
    main()
