#!/usr/bin/env python3
"""CPU benchmark: the same small BERT trained by brisk and by PyTorch eager + transformers'
Trainer on this machine, same batch, steps, sequence length, precision and optimizer; prints
samples/s, optimizer-state bytes and peak process memory side by side. Rows: fp32 and bf16 with
AdamW, then one per optimizer (adafactor, adamw_8bit = bitsandbytes' AdamW 8-bit on the
PyTorch side, sgd with momentum), and bf16 without master weights (brisk only: Trainer has no
such option).

Run (after scripts/build.sh and scripts/setup_python.sh):
    .venv/bin/python bench/cpu_bert.py [--steps 30] [--batch 8] [--seq 128] [--rows all|precision|optim]
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
BRISK = os.environ.get("BRISK_BIN", os.path.join(ROOT, "build", "brisk"))

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
cfg_path, out_dir, steps, batch, seq, precision, optim, optim_args = sys.argv[1:9]
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
                         disable_tqdm=True, optim=optim, optim_args=optim_args or None)
trainer = Trainer(model=model, args=args, train_dataset=DS())
result = trainer.train()
state = sum(t.numel() * t.element_size() for st in trainer.optimizer.state.values()
            for t in st.values() if torch.is_tensor(t) and t.dim() > 0)
print(json.dumps({"samples_per_second": result.metrics["train_samples_per_second"],
                  "optimizer_state": state,
                  "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
'''


# (label, precision, optim, optim_args, brisk-only extra flags)
PRECISION_ROWS = [("fp32 adamw", "fp32", "adamw_torch", "", []),
                  ("bf16 adamw", "bf16", "adamw_torch", "", [])]
OPTIM_ROWS = [("fp32 adafactor", "fp32", "adafactor", "", []),
              ("fp32 adamw_8bit", "fp32", "adamw_bnb_8bit", "", []),
              ("fp32 sgd m=0.9", "fp32", "sgd", "momentum=0.9", []),
              ("bf16 no master", "bf16", "adamw_torch", "", ["--bf16_master_weights", "false"])]


def run_brisk(cfg_dir, out_dir, steps, batch, seq, precision, optim, optim_args, extra):
    cmd = [BRISK, "train", "--model", cfg_dir, "--per_device_train_batch_size", str(batch),
           "--seq_len", str(seq), "--dataset_size", str(steps * batch), "--max_steps", str(steps),
           "--logging_steps", str(steps), "--save_strategy", "no", "--output_dir", out_dir,
           "--device", "cpu", "--optim", optim, "--optim_args", optim_args] + extra
    if precision == "bf16":
        cmd.append("--bf16")
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out_dir, "train_results.json")) as f:
        r = json.load(f)
    return {"samples_per_second": r["train_samples_per_second"],
            "optimizer_state": r["memory"]["planned_bytes"]["optimizer_state"],
            "peak_rss": r["memory"]["peak_rss_bytes"]}


def run_hf(cfg_dir, out_dir, steps, batch, seq, precision, optim, optim_args, extra):
    if extra:
        return None  # an option Trainer does not have
    p = subprocess.run([sys.executable, "-c", HF_CHILD, cfg_dir, out_dir, str(steps), str(batch),
                        str(seq), precision, optim, optim_args], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("transformers run failed:\n" + p.stderr[-3000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rows", choices=["all", "precision", "optim"], default="all")
    a = ap.parse_args()
    plan = (PRECISION_ROWS if a.rows != "optim" else []) + (OPTIM_ROWS if a.rows != "precision" else [])
    with tempfile.TemporaryDirectory() as tmp:
        cfg_dir = os.path.join(tmp, "model")
        os.makedirs(cfg_dir)
        with open(os.path.join(cfg_dir, "config.json"), "w") as f:
            json.dump(CONFIG, f)
        rows = []
        for i, (label, *setup) in enumerate(plan):
            b = run_brisk(cfg_dir, os.path.join(tmp, f"brisk_{i}"), a.steps, a.batch, a.seq, *setup)
            h = run_hf(cfg_dir, os.path.join(tmp, f"hf_{i}"), a.steps, a.batch, a.seq, *setup)
            rows.append((label, b, h))
    mib = lambda x: f"{x / 2**20:.1f} MiB"
    ratio = lambda x, y: f"{x / y:.2f}" if y else "n/a"
    print(f"BERT 4 x 256 (seq {a.seq}, batch {a.batch}, {a.steps} steps, dropout on), "
          f"{os.cpu_count()} CPU threads")
    print(f"{'row':<17}{'brisk samples/s':>16}{'HF samples/s':>13}{'speed x':>8}"
          f"{'brisk opt state':>16}{'HF opt state':>13}{'brisk peak':>12}{'HF peak':>11}"
          f"{'memory x':>9}")
    for label, b, h in rows:
        hs = f"{h['samples_per_second']:.2f}" if h else "n/a"
        ho = mib(h["optimizer_state"]) if h else "n/a"
        hp = mib(h["peak_rss"]) if h else "n/a"
        print(f"{label:<17}{b['samples_per_second']:>16.2f}{hs:>13}"
              f"{ratio(b['samples_per_second'], h['samples_per_second']) if h else 'n/a':>8}"
              f"{mib(b['optimizer_state']):>16}{ho:>13}{mib(b['peak_rss']):>12}{hp:>11}"
              f"{ratio(b['peak_rss'], h['peak_rss']) if h else 'n/a':>9}")


if __name__ == "__main__":
    main()
