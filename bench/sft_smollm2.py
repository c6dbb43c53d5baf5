#!/usr/bin/env python3
"""A causal LM fine-tuned on rows, side by side: the real SmolLM2-135M (data/smollm2-135m from
scripts/get_data.sh) on verses of the King James Bible (data/kjv/kjv.txt, one verse a line), each
verse one sample ended by the eos token, as TRL's SFTTrainer prepares a text dataset; by brisk
(--line_by_line: padded to each batch's longest, --padding_free, --packing) and by TRL's
SFTTrainer (padded, padding_free=True, packing=True with its "bfd" strategy) on the same CPU in
one run. The first --rows non-blank lines train for one epoch, the next --eval_rows evaluate;
max length --block tokens, batch --batch (packed: rows of --block tokens), AdamW at lr --lr with
linear decay, seed 42, float32. Every run reads the same tokens once, so the epoch's time compares
directly: verses/s = rows / train_runtime. Prints it, the steps, the peak process memory (of
training) and the eval loss per token (brisk's eval_loss; for SFTTrainer computed verse by verse,
its own eval_loss being a mean of its batches' means), before training and after.

Run (after scripts/build.sh, scripts/setup_python.sh and scripts/get_data.sh):
    .venv/bin/python bench/sft_smollm2.py [--rows 256] [--only brisk,brisk_free,brisk_packed,
                                           trl,trl_free,trl_packed]
"""
import argparse
import json
import os
import subprocess
import tempfile

from common import BRISK, ROOT, cpu_name, require_data, run_child

MODEL = os.path.join(ROOT, "data", "smollm2-135m")
TEXT = os.path.join(ROOT, "data", "kjv", "kjv.txt")

PY_CHILD = r'''
import json, resource, sys, time
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, logging
from trl import SFTConfig, SFTTrainer
logging.set_verbosity_error()
how, model_dir, train_txt, eval_txt, out_dir, batch, block, lr = sys.argv[1:9]
batch, block, lr = int(batch), int(block), float(lr)
torch.manual_seed(42)
def rows(path):
    with open(path, encoding="utf-8") as f:
        return Dataset.from_dict({"text": [l.rstrip("\n") for l in f if l.strip()]})
train_ds, eval_ds = rows(train_txt), rows(eval_txt)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                             attn_implementation="sdpa")
args = SFTConfig(output_dir=out_dir, per_device_train_batch_size=batch,
                 per_device_eval_batch_size=batch, learning_rate=lr, num_train_epochs=1,
                 # TRL refuses a max length without packing's cut under padding_free; the
                 # verses are shorter than it anyway (the table says their longest).
                 max_length=None if how == "free" else block,
                 padding_free=how == "free", packing=how == "packed",
                 eval_packing=False, report_to="none", save_strategy="no", logging_steps=10,
                 eval_strategy="no", use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
                 seed=42)
trainer = SFTTrainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                     processing_class=AutoTokenizer.from_pretrained(model_dir))
tok = trainer.processing_class
def token_mean():
    """The eval verses' loss per token, each verse alone (brisk's eval_loss; the Trainer's own
    is a mean of its batches' means)."""
    model.eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for text in eval_ds["text"]:
            x = torch.tensor([tok(text + tok.eos_token)["input_ids"]])
            logits = model(input_ids=x).logits[0, :-1]
            total += torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum").item()
            n += x.shape[1] - 1
    return total / n
before = token_mean()
result = trainer.train()
out = {"eval_loss_before": before, "train_runtime": result.metrics["train_runtime"],
       "steps": result.global_step, "train_loss": result.metrics["train_loss"]}
out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
out["eval_loss"] = token_mean()
print(json.dumps(out))
'''

BRISK_FLAGS = {"brisk": [], "brisk_free": ["--padding_free"], "brisk_packed": ["--packing"]}
TRL_HOW = {"trl": "padded", "trl_free": "free", "trl_packed": "packed"}
LABELS = {"brisk": "brisk, padded", "brisk_free": "brisk, `--padding_free`",
          "brisk_packed": "brisk, `--packing`", "trl": "SFTTrainer, padded",
          "trl_free": "SFTTrainer, `padding_free=True`", "trl_packed": "SFTTrainer, `packing=True`"}


def brisk_command(train_txt, eval_txt, out_dir, a):
    return [BRISK, "train", "--model", MODEL, "--train_file", train_txt, "--validation_file",
           eval_txt, "--line_by_line", "--block_size", str(a.block),
           "--per_device_train_batch_size", str(a.batch), "--per_device_eval_batch_size",
           str(a.batch), "--learning_rate", str(a.lr), "--num_train_epochs", "1",
           "--save_strategy", "no", "--logging_steps", "10", "--seed", "42", "--output_dir",
           out_dir, "--disable_tqdm", "--device", "cpu", "--do_eval"]


def brisk_eval_loss(train_txt, eval_txt, out_dir, a):
    """The pretrained model's evaluation loss on the held-out verses, as brisk prepares them."""
    cmd = brisk_command(train_txt, eval_txt, out_dir, a) + ["--do_train", "false"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.load(open(os.path.join(out_dir, "eval_results.json")))["eval_loss"]


def run_brisk(name, train_txt, eval_txt, out_dir, a):
    cmd = brisk_command(train_txt, eval_txt, out_dir, a) + BRISK_FLAGS[name]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    train = json.load(open(os.path.join(out_dir, "train_results.json")))
    evals = json.load(open(os.path.join(out_dir, "eval_results.json")))
    state = json.load(open(os.path.join(out_dir, "trainer_state.json")))
    return {"train_runtime": train["train_runtime"], "steps": state["global_step"],
            "train_loss": train["train_loss"], "eval_loss": evals["eval_loss"],
            "planned": sum(train["memory"]["planned_bytes"].values()),
            "peak_rss": train["memory"]["peak_rss_bytes"]}


def split_rows(tmp, a):
    """The first a.rows non-blank lines, and the a.eval_rows after them, as two files."""
    with open(TEXT, encoding="utf-8") as f:
        lines = [l for l in f if l.strip()]
    train, dev = lines[:a.rows], lines[a.rows:a.rows + a.eval_rows]
    paths = os.path.join(tmp, "train.txt"), os.path.join(tmp, "eval.txt")
    for path, part in zip(paths, (train, dev)):
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(part)
    return paths, train


def token_counts(train):
    """Tokens per verse (with the eos token), as both sides tokenize them."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(MODEL)
    n = [len(tok(l.rstrip("\n"))["input_ids"]) + 1 for l in train]
    return sum(n) / len(n), max(n)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--eval_rows", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--only", default="brisk,brisk_free,brisk_packed,trl,trl_free,trl_packed")
    a = p.parse_args()
    require_data(MODEL, TEXT)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        (train_txt, eval_txt), train = split_rows(tmp, a)
        mean, longest = token_counts(train)
        before = brisk_eval_loss(train_txt, eval_txt, os.path.join(tmp, "eval0"), a)
        for name in a.only.split(","):
            out = os.path.join(tmp, name)
            try:
                results[name] = (
                    run_brisk(name, train_txt, eval_txt, out, a) if name in BRISK_FLAGS else
                    run_child(PY_CHILD, TRL_HOW[name], MODEL, train_txt, eval_txt, out, a.batch,
                              a.block, a.lr))
            except (subprocess.CalledProcessError, ValueError) as e:  # reported, not hidden
                text = (getattr(e, "stderr", None) or str(e)).strip()
                results[name] = {"error": text.splitlines()[-1][:120]}
            print(name, json.dumps(results[name]), flush=True)
    print(f"\nSmolLM2-135M fine-tuned on {a.rows} KJV verses ({mean:.1f} tokens each on average, "
          f"at most {longest}, eos included), 1 epoch, batch {a.batch}, max length {a.block}, "
          f"lr {a.lr}, float32, eval on the next {a.eval_rows}; CPU: {cpu_name()}, "
          f"{os.cpu_count()} threads. Eval loss of the pretrained model: brisk {before:.4f}, "
          f"SFTTrainer {results.get('trl', {}).get('eval_loss_before', float('nan')):.4f}")
    print("| run | steps | verses/s | vs SFTTrainer padded | peak process memory | eval loss |")
    print("|---|---|---|---|---|---|")
    base = results.get("trl", {})
    for name, r in results.items():
        if "error" in r:
            print(f"| {LABELS[name]} | failed: {r['error']} | | | | |")
            continue
        speed = a.rows / r["train_runtime"]
        ratio = (f"{base['train_runtime'] / r['train_runtime']:.2f}x"
                 if "train_runtime" in base else "-")
        print(f"| {LABELS[name]} | {r['steps']} | {speed:.2f} | {ratio} | "
              f"{r['peak_rss'] / 2**20:.0f} MiB | {r['eval_loss']:.4f} |")


if __name__ == "__main__":
    main()
