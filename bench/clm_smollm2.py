#!/usr/bin/env python3
"""Fine-tuning the real SmolLM2-135M (a Llama: 30 layers, hidden 576, 9 query heads over 3
key/value heads, tied 49,152-token head; data/smollm2-135m from scripts/get_data.sh) on the King
James Bible as run_clm prepares it, by brisk, by transformers' Trainer, by a plain PyTorch loop
and by the same loop under torch.compile, in fp32 and bf16 (autocast in the loops, as Trainer): every line with its line break
tokenized by the model's own tokenizer, blocks of --block tokens grouped per 1000 lines, 95% of
the lines for training; batch --batch, AdamW, lr 5e-5 with linear decay, seed 42, the same
pretrained weights. Prints train samples/s over the whole run (for the PyTorch loops also after
the first step, where torch.compile compiles), the mean train loss and the peak process memory
side by side.

Run (after scripts/build.sh, scripts/setup_python.sh and scripts/get_data.sh):
    .venv/bin/python bench/clm_smollm2.py [--max_steps 6] [--only brisk,trainer,torch,compile]
                                          [--precisions fp32,bf16]
"""
import argparse
import json
import os
import subprocess
import tempfile

from common import RUN_CLM_BLOCKS, cpu_name, require_data, run_child

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BRISK = os.environ.get("BRISK_BIN", os.path.join(ROOT, "build", "brisk"))
MODEL = os.path.join(ROOT, "data", "smollm2-135m")
TEXT = os.path.join(ROOT, "data", "kjv", "kjv.txt")

PY_CHILD = r'''
import contextlib, json, resource, sys, time
import torch
from transformers import (AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments,
                          default_data_collator, get_linear_schedule_with_warmup, logging)
logging.set_verbosity_error()
mode, precision, model_dir, text, out_dir, max_steps, batch, block, lr = sys.argv[1:10]
max_steps, batch, block, lr = int(max_steps), int(batch), int(block), float(lr)
bf16 = precision == "bf16"
torch.manual_seed(42)
tok = AutoTokenizer.from_pretrained(model_dir)
''' + RUN_CLM_BLOCKS + r'''
train_ds = blocks(lines[cut:])
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                             attn_implementation="sdpa")
if mode == "trainer":
    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=batch,
                             learning_rate=lr, max_steps=max_steps, report_to="none",
                             save_strategy="no", logging_strategy="steps", logging_steps=1,
                             eval_strategy="no", use_cpu=True, bf16=bf16,
                             dataloader_num_workers=0, disable_tqdm=True, seed=42)
    trainer = Trainer(model=model, args=args, train_dataset=train_ds,
                      data_collator=default_data_collator)
    result = trainer.train()
    out = {"samples_per_second": result.metrics["train_samples_per_second"],
           "train_loss": result.metrics["train_loss"]}
else:  # a plain PyTorch loop over the same blocks (autocast for bf16, as Trainer does)
    step_model = torch.compile(model) if mode == "compile" else model
    g = torch.Generator().manual_seed(42)
    loader = torch.utils.data.DataLoader(train_ds, batch_size=batch, shuffle=True, generator=g,
                                         collate_fn=default_data_collator)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = get_linear_schedule_with_warmup(opt, 0, max_steps)
    model.train()
    done, samples, losses, start = 0, 0, [], time.perf_counter()
    steady = None  # after the first step (torch.compile compiles there)
    for b in loader:
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with ctx:
            loss = step_model(**b).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step(); sched.step(); opt.zero_grad()
        losses.append(loss.item())
        done += 1; samples += len(b["labels"])
        if done == 1: steady = time.perf_counter()
        if done == max_steps: break
    end = time.perf_counter()
    out = {"samples_per_second": samples / (end - start),
           "steady_samples_per_second": (samples - batch) / (end - steady),
           "train_loss": sum(losses) / len(losses)}
out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps(out))
'''


def run_brisk(precision, out_dir, a):
    cmd = [BRISK, "train", "--model", MODEL, "--train_file", TEXT, "--block_size", str(a.block),
           "--validation_split_percentage", "5", "--per_device_train_batch_size", str(a.batch),
           "--learning_rate", str(a.lr), "--max_steps", str(a.max_steps), "--save_strategy",
           "no", "--logging_steps", "1", "--seed", "42", "--output_dir", out_dir,
           "--disable_tqdm", "--device", "cpu", "--bf16", "true" if precision == "bf16" else "false"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    train = json.load(open(os.path.join(out_dir, "train_results.json")))
    return {"samples_per_second": train["train_samples_per_second"],
            "train_loss": train["train_loss"], "peak_rss": train["memory"]["peak_rss_bytes"]}


def run_python(mode, precision, out_dir, a):
    return run_child(PY_CHILD, mode, precision, MODEL, TEXT, out_dir, a.max_steps, a.batch,
                     a.block, a.lr)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--max_steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--block", type=int, default=256)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--only", default="brisk,trainer,torch,compile")
    p.add_argument("--precisions", default="fp32,bf16")
    a = p.parse_args()
    require_data(MODEL, TEXT)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for precision in a.precisions.split(","):
            for name in a.only.split(","):
                out = os.path.join(tmp, f"{name}-{precision}")
                key = (name, precision)
                results[key] = (run_brisk(precision, out, a) if name == "brisk"
                                else run_python(name, precision, out, a))
                print(name, precision, json.dumps(results[key]), flush=True)
    cpu = cpu_name()
    print(f"\nSmolLM2-135M fine-tuned on the KJV text ({a.max_steps} steps, batch {a.batch}, "
          f"block_size {a.block}, lr {a.lr}); CPU: {cpu}, {os.cpu_count()} threads")
    print("| run | precision | mean train loss | train samples/s | after step 1 | "
          "peak process memory |")
    print("|---|---|---|---|---|---|")
    for (name, precision), r in results.items():
        base = results.get(("trainer", precision))
        loss = f"{r['train_loss']:.4f}"
        sps = f"{r['samples_per_second']:.3f}"
        mem = f"{r['peak_rss'] / 2**20:.0f} MiB"
        if base and name != "trainer":
            sps += f" ({r['samples_per_second'] / base['samples_per_second']:.2f}x Trainer)"
            mem += f" ({r['peak_rss'] / base['peak_rss']:.2f}x)"
        steady = r.get("steady_samples_per_second")
        steady = f"{steady:.3f}" if steady else "-"
        print(f"| {name} | {precision} | {loss} | {sps} | {steady} | {mem} |")


if __name__ == "__main__":
    main()
