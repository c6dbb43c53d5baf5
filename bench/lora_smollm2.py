#!/usr/bin/env python3
"""Full fine-tuning, LoRA and QLoRA of the real SmolLM2-135M (data/smollm2-135m from
scripts/get_data.sh) on the King James Bible as run_clm prepares it, by brisk and by transformers'
Trainer with PEFT (and bitsandbytes for QLoRA), on the same CPU in one run: the same pretrained
weights, blocks of --block tokens, batch --batch, AdamW at lr --lr (linear decay), seed 42,
--max_steps steps, then the evaluation loss on the first --eval_blocks blocks of the held-out 5%
of the lines. LoRA as TRL's defaults: r 16, alpha 32, dropout 0.05, PEFT's default targets for a
Llama (q_proj, v_proj). QLoRA: NF4 with nested absmaxes, float32 compute. Prints train samples/s,
brisk's planned memory, the peak process memory and the eval loss side by side.

Run (after scripts/build.sh, scripts/setup_python.sh and scripts/get_data.sh):
    .venv/bin/python bench/lora_smollm2.py [--max_steps 10] [--only brisk,trainer]
                                           [--kinds full,lora,qlora]
"""
import argparse
import json
import os
import subprocess
import tempfile

from common import BRISK, ROOT, RUN_CLM_BLOCKS, cpu_name, require_data, run_child

MODEL = os.path.join(ROOT, "data", "smollm2-135m")
TEXT = os.path.join(ROOT, "data", "kjv", "kjv.txt")

PY_CHILD = r'''
import json, resource, sys, time
import torch
from transformers import (AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig, Trainer,
                          TrainingArguments, default_data_collator, logging)
logging.set_verbosity_error()
kind, model_dir, text, out_dir, max_steps, batch, block, lr, eval_blocks = sys.argv[1:10]
max_steps, batch, block, lr, eval_blocks = (int(max_steps), int(batch), int(block), float(lr),
                                            int(eval_blocks))
torch.manual_seed(42)
tok = AutoTokenizer.from_pretrained(model_dir)
''' + RUN_CLM_BLOCKS + r'''
train_ds, eval_ds = blocks(lines[cut:]), blocks(lines[:cut])[:eval_blocks]
load = {"dtype": torch.float32, "attn_implementation": "sdpa"}
if kind == "qlora":
    load["quantization_config"] = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.float32)
model = AutoModelForCausalLM.from_pretrained(model_dir, **load)
if kind != "full":
    from peft import LoraConfig, get_peft_model
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05,
                                             task_type="CAUSAL_LM"))
args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=batch,
                         per_device_eval_batch_size=batch, learning_rate=lr, max_steps=max_steps,
                         report_to="none", save_strategy="no", logging_strategy="steps",
                         logging_steps=1, eval_strategy="no", use_cpu=True,
                         dataloader_num_workers=0, disable_tqdm=True, seed=42)
trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                  data_collator=default_data_collator)
result = trainer.train()
out = {"samples_per_second": result.metrics["train_samples_per_second"],
       "train_loss": result.metrics["train_loss"],
       "eval_loss": trainer.evaluate()["eval_loss"]}
out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps(out))
'''

KIND_FLAGS = {
    "full": [],
    "lora": ["--use_peft", "--lora_r", "16", "--lora_alpha", "32", "--lora_dropout", "0.05"],
    "qlora": ["--use_peft", "--lora_r", "16", "--lora_alpha", "32", "--lora_dropout", "0.05",
              "--load_in_4bit", "--bnb_4bit_quant_type", "nf4", "--use_bnb_nested_quant"],
}


def run_brisk(kind, out_dir, a):
    cmd = [BRISK, "train", "--model", MODEL, "--train_file", TEXT, "--block_size", str(a.block),
           "--validation_split_percentage", "5", "--per_device_train_batch_size", str(a.batch),
           "--per_device_eval_batch_size", str(a.batch), "--learning_rate", str(a.lr),
           "--max_steps", str(a.max_steps), "--save_strategy", "no", "--logging_steps", "1",
           "--seed", "42", "--output_dir", out_dir, "--disable_tqdm", "--device", "cpu",
           "--do_eval", "--max_eval_samples", str(a.eval_blocks)] + KIND_FLAGS[kind]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    train = json.load(open(os.path.join(out_dir, "train_results.json")))
    evals = json.load(open(os.path.join(out_dir, "eval_results.json")))
    planned = sum(train["memory"]["planned_bytes"].values())
    return {"samples_per_second": train["train_samples_per_second"],
            "train_loss": train["train_loss"], "eval_loss": evals["eval_loss"],
            "planned": planned, "peak_rss": train["memory"]["peak_rss_bytes"]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--max_steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--eval_blocks", type=int, default=32)
    p.add_argument("--only", default="brisk,trainer")
    p.add_argument("--kinds", default="full,lora,qlora")
    a = p.parse_args()
    require_data(MODEL, TEXT)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in a.kinds.split(","):
            for name in a.only.split(","):
                out = os.path.join(tmp, f"{name}-{kind}")
                try:
                    results[(name, kind)] = (
                        run_brisk(kind, out, a) if name == "brisk" else
                        run_child(PY_CHILD, kind, MODEL, TEXT, out, a.max_steps, a.batch, a.block,
                                  a.lr, a.eval_blocks))
                except (subprocess.CalledProcessError, ValueError) as e:  # reported, not hidden
                    text = (getattr(e, "stderr", None) or str(e)).strip()
                    results[(name, kind)] = {"error": text.splitlines()[-1][:120]}
                print(name, kind, json.dumps(results[(name, kind)]), flush=True)
    print(f"\nSmolLM2-135M on the KJV text ({a.max_steps} steps, batch {a.batch}, block_size "
          f"{a.block}, lr {a.lr}, eval on {a.eval_blocks} blocks); CPU: {cpu_name()}, "
          f"{os.cpu_count()} threads")
    print("| run | fine-tuning | train samples/s | planned memory | peak process memory | "
          "eval loss |")
    print("|---|---|---|---|---|---|")
    names = {"brisk": "brisk", "trainer": "Trainer + PEFT"}
    for (name, kind), r in results.items():
        label = "Trainer" if name == "trainer" and kind == "full" else names[name]
        if kind == "qlora" and name == "trainer":
            label += " + bitsandbytes"
        if "error" in r:
            print(f"| {label} | {kind} | failed: {r['error']} | | | |")
            continue
        base = results.get(("trainer", kind), {})
        sps = f"{r['samples_per_second']:.3f}"
        mem = f"{r['peak_rss'] / 2**20:.0f} MiB"
        if name != "trainer" and "samples_per_second" in base:
            sps += f" ({r['samples_per_second'] / base['samples_per_second']:.2f}x)"
            mem += f" ({r['peak_rss'] / base['peak_rss']:.2f}x)"
        planned = f"{r['planned'] / 2**20:.0f} MiB" if "planned" in r else "-"
        print(f"| {label} | {kind} | {sps} | {planned} | {mem} | {r['eval_loss']:.4f} |")


if __name__ == "__main__":
    main()
