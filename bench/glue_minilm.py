#!/usr/bin/env python3
"""Real fine-tuning, side by side: the pretrained all-MiniLM-L6-v2 fine-tuned on the Rotten
Tomatoes snippets (data/ from scripts/get_data.sh) as run_glue does it, by brisk and by
transformers' Trainer, and by a plain PyTorch loop, with the same split and settings
(max_seq_length 64, batch 32, AdamW, lr 5e-5 with linear decay, seed 42). --padding
max_length pads every batch to max_seq_length on every side (run_glue's default,
pad_to_max_length true); --padding dynamic pads each batch to its longest row rounded up to 8 on
every side (brisk's default; DataCollatorWithPadding(pad_to_multiple_of=8) for the Python runs).
The run `brisk_free` is brisk with --padding_free (TRL's name): each batch's samples end to end,
no padding computed (with --padding dynamic; its evaluation pads as brisk's default does).
Prints eval accuracy, train samples/s and peak process memory.

Run (after scripts/build.sh, scripts/setup_python.sh and scripts/get_data.sh):
    .venv/bin/python bench/glue_minilm.py [--epochs 2] [--max_steps N] [--padding dynamic]
        [--only brisk,brisk_free,trainer,torch] [--seed 42]
"""
import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import tempfile

from common import cpu_name, run_child

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BRISK = os.environ.get("BRISK_BIN", os.path.join(ROOT, "build", "brisk"))
DATA = os.path.join(ROOT, "data")
MODEL = os.path.join(DATA, "all-MiniLM-L6-v2")
TRAIN = os.path.join(DATA, "rotten_tomatoes", "train.csv")
DEV = os.path.join(DATA, "rotten_tomatoes", "validation.csv")

PY_CHILD = r'''
import csv, json, resource, sys, time
import numpy as np, torch
from transformers import (AutoTokenizer, BertForSequenceClassification, DataCollatorWithPadding,
                          Trainer, TrainingArguments, default_data_collator,
                          get_linear_schedule_with_warmup, logging)
logging.set_verbosity_error()
mode, model_dir, train_csv, dev_csv, out_dir, epochs, max_steps, batch, seq, lr = sys.argv[1:11]
padding = sys.argv[11]
epochs, max_steps, batch, seq, lr = float(epochs), int(max_steps), int(batch), int(seq), float(lr)
torch.manual_seed(42)
def rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return [(r["sentence"], r["label"]) for r in csv.DictReader(f)]
train, dev = rows(train_csv), rows(dev_csv)
labels = sorted({l for _, l in train})
tok = AutoTokenizer.from_pretrained(model_dir)
def encode(data):
    pad = "max_length" if padding == "max_length" else False
    enc = tok([s for s, _ in data], padding=pad, truncation=True, max_length=seq)
    return [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i],
             "token_type_ids": enc["token_type_ids"][i], "labels": labels.index(l)}
            for i, (_, l) in enumerate(data)]
collate = (default_data_collator if padding == "max_length"
           else DataCollatorWithPadding(tok, pad_to_multiple_of=8))
train_ds, dev_ds = encode(train), encode(dev)
model = BertForSequenceClassification.from_pretrained(
    model_dir, num_labels=len(labels), id2label=dict(enumerate(labels)),
    label2id={l: i for i, l in enumerate(labels)})
def accuracy(pred):
    return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}
if mode == "trainer":
    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=batch,
                             per_device_eval_batch_size=batch, learning_rate=lr,
                             num_train_epochs=epochs, max_steps=max_steps if max_steps > 0 else -1,
                             report_to="none", save_strategy="no", logging_strategy="no",
                             eval_strategy="no", use_cpu=True, dataloader_num_workers=0,
                             disable_tqdm=True, seed=42)
    trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=dev_ds,
                      compute_metrics=accuracy, data_collator=collate)
    result = trainer.train()
    ev = trainer.evaluate()
    out = {"samples_per_second": result.metrics["train_samples_per_second"],
           "accuracy": ev["eval_accuracy"], "eval_loss": ev["eval_loss"]}
else:  # a plain PyTorch loop: same batches, AdamW, linear decay
    g = torch.Generator().manual_seed(42)
    loader = torch.utils.data.DataLoader(train_ds, batch_size=batch, shuffle=True, generator=g,
                                         collate_fn=collate)
    steps = max_steps if max_steps > 0 else int(np.ceil(epochs * len(loader)))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = get_linear_schedule_with_warmup(opt, 0, steps)
    model.train()
    done, samples, start = 0, 0, time.perf_counter()
    while done < steps:
        for b in loader:
            loss = model(**b).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step(); sched.step(); opt.zero_grad()
            done += 1; samples += len(b["labels"])
            if done == steps: break
    secs = time.perf_counter() - start
    model.eval()
    right = 0
    with torch.no_grad():
        for b in torch.utils.data.DataLoader(dev_ds, batch_size=batch, collate_fn=collate):
            right += int((model(**b).logits.argmax(-1) == b["labels"]).sum())
    out = {"samples_per_second": samples / secs, "accuracy": right / len(dev_ds)}
out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps(out))
'''


def run_brisk(out_dir, a, padding_free=False):
    cmd = [BRISK, "train", "--model", MODEL, "--train_file", TRAIN, "--validation_file", DEV,
           "--max_seq_length", str(a.seq), "--per_device_train_batch_size", str(a.batch),
           "--per_device_eval_batch_size", str(a.batch), "--learning_rate", str(a.lr),
           "--num_train_epochs", str(a.epochs), "--max_steps", str(a.max_steps),
           "--do_eval", "--save_strategy", "no", "--logging_steps", "100", "--seed", str(a.seed),
           "--output_dir", out_dir, "--disable_tqdm", "--device", "cpu",
           "--pad_to_max_length", "true" if a.padding == "max_length" else "false"]
    if padding_free:
        cmd += ["--padding_free", "true"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    train = json.load(open(os.path.join(out_dir, "train_results.json")))
    ev = json.load(open(os.path.join(out_dir, "eval_results.json")))
    return {"samples_per_second": train["train_samples_per_second"],
            "accuracy": ev["eval_accuracy"], "eval_loss": ev["eval_loss"],
            "peak_rss": train["memory"]["peak_rss_bytes"],
            "planned": sum(train["memory"]["planned_bytes"].values())}


def run_python(mode, out_dir, a):
    return run_child(PY_CHILD, mode, MODEL, TRAIN, DEV, out_dir, a.epochs, a.max_steps, a.batch,
                     a.seq, a.lr, a.padding)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=float, default=2)
    p.add_argument("--max_steps", type=int, default=-1)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--padding", choices=("max_length", "dynamic"), default="max_length")
    p.add_argument("--only", default="brisk,trainer,torch")
    p.add_argument("--seed", type=int, default=42, help="brisk's runs' seed (the Python runs: 42)")
    a = p.parse_args()
    for path in (MODEL, TRAIN, DEV):
        if not os.path.exists(path):
            sys.exit(f"{path} is missing: run scripts/get_data.sh")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.only.split(","):
            out = os.path.join(tmp, name)
            if name.startswith("brisk"):
                results[name] = run_brisk(out, a, padding_free=name == "brisk_free")
            else:
                results[name] = run_python(name, out, a)
            print(name, json.dumps(results[name]), flush=True)
    cpu = cpu_name()
    print(f"\nall-MiniLM-L6-v2 on Rotten Tomatoes ({a.epochs} epochs, batch {a.batch}, "
          f"max_seq_length {a.seq}, lr {a.lr}, padding {a.padding}); CPU: {cpu}, "
          f"{os.cpu_count()} threads")
    print("| run | eval accuracy | train samples/s | peak process memory |")
    print("|---|---|---|---|")
    base = results.get("trainer")
    for name, r in results.items():
        ratio = ""
        if base and name != "trainer":
            ratio = (f" ({r['samples_per_second'] / base['samples_per_second']:.2f}x Trainer)",
                     f" ({r['peak_rss'] / base['peak_rss']:.2f}x Trainer)")
        sps = f"{r['samples_per_second']:.1f}" + (ratio[0] if ratio else "")
        mem = f"{r['peak_rss'] / 2**20:.0f} MiB" + (ratio[1] if ratio else "")
        print(f"| {name} | {100 * r['accuracy']:.2f}% | {sps} | {mem} |")
    if "brisk" in results and "brisk_free" in results:
        d, f = results["brisk"], results["brisk_free"]
        print(f"\n--padding_free against brisk's {a.padding} padding: "
              f"{f['samples_per_second'] / d['samples_per_second']:.2f}x samples/s, "
              f"{f['peak_rss'] / d['peak_rss']:.2f}x peak memory, "
              f"eval loss {f['eval_loss']:.4f} vs {d['eval_loss']:.4f}")


if __name__ == "__main__":
    main()
