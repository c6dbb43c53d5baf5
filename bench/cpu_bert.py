#!/usr/bin/env python3
"""CPU benchmark: the same small BERT trained by brisk and by PyTorch eager + transformers'
Trainer on this machine, same batch, steps, sequence length and precision; prints samples/s and
peak process memory side by side.

Run (after scripts/build.sh and scripts/setup_python.sh):
    .venv/bin/python bench/cpu_bert.py [--steps 30] [--batch 8] [--seq 128]
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BRISK = os.path.join(ROOT, "build", "brisk")

CONFIG = {"model_type": "bert", "vocab_size": 30522, "hidden_size": 256, "num_hidden_layers": 4,
          "num_attention_heads": 4, "intermediate_size": 1024, "max_position_embeddings": 512,
          "type_vocab_size": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
          "attention_probs_dropout_prob": 0.1, "layer_norm_eps": 1e-12,
          "id2label": {"0": "LABEL_0", "1": "LABEL_1"}, "label2id": {"LABEL_0": 0, "LABEL_1": 1}}

HF_CHILD = r'''
import json, sys, resource, time
import numpy as np, torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments, logging
logging.set_verbosity_error()
cfg_path, out_dir, steps, batch, seq, precision = sys.argv[1:7]
steps, batch, seq = int(steps), int(batch), int(seq)
torch.manual_seed(42)
model = BertForSequenceClassification(BertConfig.from_pretrained(cfg_path))
n = steps * batch
ids = np.random.randint(100, 30000, (n, seq))
labels = np.random.randint(0, 1, (n,))
class DS(torch.utils.data.Dataset):
    def __len__(self): return n
    def __getitem__(self, i):
        return {"input_ids": torch.tensor(ids[i]), "labels": torch.tensor(labels[i])}
args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=batch, max_steps=steps,
                         report_to="none", save_strategy="no", logging_strategy="no",
                         use_cpu=True, bf16=(precision == "bf16"), dataloader_num_workers=0,
                         disable_tqdm=True)
result = Trainer(model=model, args=args, train_dataset=DS()).train()
print(json.dumps({"samples_per_second": result.metrics["train_samples_per_second"],
                  "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
'''


def run_brisk(cfg_dir, out_dir, steps, batch, seq, precision):
    cmd = [BRISK, "train", "--model", cfg_dir, "--per_device_train_batch_size", str(batch),
           "--seq_len", str(seq), "--dataset_size", str(steps * batch), "--max_steps", str(steps),
           "--logging_steps", str(steps), "--save_steps", "0", "--output_dir", out_dir,
           "--device", "cpu"]
    if precision == "bf16":
        cmd.append("--bf16")
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out_dir, "train_results.json")) as f:
        r = json.load(f)
    return {"samples_per_second": r["train_samples_per_second"],
            "peak_rss": r["memory"]["peak_rss_bytes"]}


def run_hf(cfg_dir, out_dir, steps, batch, seq, precision):
    p = subprocess.run([sys.executable, "-c", HF_CHILD, cfg_dir, out_dir, str(steps), str(batch),
                        str(seq), precision], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("transformers run failed:\n" + p.stderr[-3000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg_dir = os.path.join(tmp, "model")
        os.makedirs(cfg_dir)
        with open(os.path.join(cfg_dir, "config.json"), "w") as f:
            json.dump(CONFIG, f)
        rows = []
        for precision in ("fp32", "bf16"):
            b = run_brisk(cfg_dir, os.path.join(tmp, "brisk_" + precision), a.steps, a.batch, a.seq,
                          precision)
            h = run_hf(cfg_dir, os.path.join(tmp, "hf_" + precision), a.steps, a.batch, a.seq,
                       precision)
            rows.append((precision, b, h))
    mib = lambda x: f"{x / 2**20:.0f} MiB"
    print(f"BERT 4 x 256 (seq {a.seq}, batch {a.batch}, {a.steps} steps, dropout on), "
          f"{os.cpu_count()} CPU threads")
    print(f"{'precision':<10}{'brisk samples/s':>17}{'HF samples/s':>14}{'speed x':>9}"
          f"{'brisk peak':>12}{'HF peak':>10}{'memory x':>10}")
    for precision, b, h in rows:
        if b is None:
            print(f"{precision:<10}{'n/a':>17}{h['samples_per_second']:>14.2f}{'':>9}{'n/a':>12}"
                  f"{mib(h['peak_rss']):>10}")
            continue
        print(f"{precision:<10}{b['samples_per_second']:>17.2f}{h['samples_per_second']:>14.2f}"
              f"{b['samples_per_second'] / h['samples_per_second']:>9.2f}"
              f"{mib(b['peak_rss']):>12}{mib(h['peak_rss']):>10}"
              f"{b['peak_rss'] / h['peak_rss']:>10.2f}")


if __name__ == "__main__":
    main()
