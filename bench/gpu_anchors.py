#!/usr/bin/env python3
"""GPU anchors at the batch sizes people use: bert-large (sequence classification, 512 tokens),
GPT-2 124M (causal LM, 1024 tokens) and a Llama shape (TinyLlama 1.1B's: grouped-query attention,
SwiGLU, RMSNorm, rotary; causal LM, 2048 tokens; --models llama), random init, bf16, AdamW,
trained by brisk, by a plain
PyTorch loop (transformers' model with attn_implementation="sdpa", autocast bf16, fused AdamW),
by the same loop under torch.compile, and by transformers' Trainer (bf16=True), one table.

Each system runs `--warmup` steps and then `--steps` timed steps; samples/s counts the timed
steps alone (brisk: the difference of a run of warmup + 10 x steps, more where a batch holds fewer
than 16384 tokens (brisk_timed_steps), and one of warmup steps, whose start-up, cuDNN's graph
builds included, varies by up to a second). "compile" compiles the model
(torch.compile(model), as Trainer's torch_compile does); the optimizer step stays eager. GPU memory
is what the process holds on the GPU: brisk's device_memory_used_bytes (its CUDA context and
arena); for PyTorch, the peak the caching allocator reserved in that row plus what nvidia-smi
reads outside the allocator after the row's steps (its CUDA context and the kernels cuBLAS, cuDNN
and compiled code loaded; before 2026-11-28 only the context before the first tensor).
MFU = tokens/s x (6 N + 12 L C T) / peak (bench/gpu_bert.py's count; --peak_tflops, 989 for an
H100 SXM's dense bf16): the blocks' products and attention. "+head" counts the causal LMs' head
products too (6 V C a token, V the real vocabulary), as llm.c and PaLM count them (the tied
embedding in N): GPT-2's head is 27% of the flops so counted.

    python bench/gpu_anchors.py [--systems brisk,torch,compile,trainer] [--models bert,gpt2,llama]
        [--batches bert:32/fit,gpt2:8/32/fit] [--fit_memory_gib G] [--plan_only]
(batch "fit": the largest multiple of 4 whose brisk plan, `brisk estimate --device cuda`, fits the
GPU's free memory or G GiB; --plan_only prints the batches and their plans, no GPU needed)
(system brisk-f32attn: brisk with BRISK_FUSED_ATTENTION=0, its float32 attention kernels;
brisk-nondet: brisk with BRISK_ATTENTION_DETERMINISTIC=0, cuDNN's fastest attention backward;
brisk-f32act: brisk with BRISK_BF16_ACTIVATIONS=0, its saved activations in float32 containers
cast per product; brisk-keptact: brisk with BRISK_RECOMPUTE_ACTIVATION=0, the MLP activation's
output kept per block, not rebuilt in backward; brisk-graphs: brisk with BRISK_RECORDED_STEPS=1,
its micro-batches recorded as CUDA graphs and replayed; brisk-base: the build at $BRISK_BASE_BIN,
to compare two builds in one run)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from gpu_bert import BERT_LARGE, BRISK, GPT2, flops_per_token, write_config, write_tokens

# TinyLlama 1.1B's shape (its published configuration's sizes).
LLAMA = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 2048,
         "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32,
         "num_key_value_heads": 4, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
         "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False}
CONFIGS = {"bert": BERT_LARGE, "gpt2": GPT2, "llama": LLAMA}
BATCHES = {"bert": (4, 16, 32), "gpt2": (8, 16, 32), "llama": (4, 8)}
SEQ = {"bert": 512, "gpt2": 1024, "llama": 2048}
CAUSAL = ("gpt2", "llama")  # trained on a token file, labels = inputs
# brisk with a measurement switch: its float32 attention kernels, cuDNN's fastest attention
# backward, saved activations in float32 containers, the MLP activation's output kept, recorded
# micro-batches (CUDA graphs).
SWITCHED = {"brisk-f32attn": {"BRISK_FUSED_ATTENTION": "0"},
            "brisk-nondet": {"BRISK_ATTENTION_DETERMINISTIC": "0"},
            "brisk-f32act": {"BRISK_BF16_ACTIVATIONS": "0"},
            "brisk-keptact": {"BRISK_RECOMPUTE_ACTIVATION": "0"},
            "brisk-graphs": {"BRISK_RECORDED_STEPS": "1"}}

TORCH_CHILD = r'''
import json, subprocess, sys, time
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification
from transformers import logging
logging.set_verbosity_error()
cfg_dir, model, system, batches, seq, warmup, steps, causal = sys.argv[1:9]
batches, seq, warmup, steps = json.loads(batches), int(seq), int(warmup), int(steps)
causal = causal == "1"
def smi_used():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                          "-i", "0"], capture_output=True, text=True).stdout.split()[0]
    return int(out) * 2**20
torch.cuda.init(); torch.zeros(1, device="cuda")
context = smi_used() - torch.cuda.memory_reserved()
config = AutoConfig.from_pretrained(cfg_dir)
config._attn_implementation = "sdpa"
for batch in batches:
    torch.manual_seed(0)
    torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
    row = {"model": model, "batch": batch, "system": system}
    try:
        with torch.device("cuda"):
            net = (AutoModelForCausalLM if causal else
                   AutoModelForSequenceClassification).from_config(config, attn_implementation="sdpa")
        net.train()
        opt = torch.optim.AdamW(net.parameters(), lr=1e-5, fused=True)
        ids = torch.randint(100, 30000, (batch, seq), device="cuda")
        labels = ids if causal else torch.zeros(batch, dtype=torch.long, device="cuda")
        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = net(input_ids=ids, labels=labels).loss
            loss.backward()
            opt.step(); opt.zero_grad(set_to_none=True)
        if system == "compile":
            net = torch.compile(net)
        run = step
        t0 = time.perf_counter()
        for _ in range(warmup): run()
        torch.cuda.synchronize()
        row["warmup_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(steps): run()
        torch.cuda.synchronize()
        row["samples_per_second"] = steps * batch / (time.perf_counter() - t0)
        # What the process holds outside the caching allocator, read now: its CUDA context and the
        # kernels cuBLAS, cuDNN and compiled code loaded since the first tensor.
        outside = max(context, smi_used() - torch.cuda.memory_reserved())
        row["gpu_memory"] = torch.cuda.max_memory_reserved() + outside
        del net, opt
    except torch.OutOfMemoryError:
        row["error"] = "out of memory"
    print(json.dumps(row), flush=True)
'''

TRAINER_CHILD = r'''
import json, sys, time
import torch
from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification,
                          Trainer, TrainerCallback, TrainingArguments, logging)
logging.set_verbosity_error()
cfg_dir, out_dir, model, batch, seq, warmup, steps, causal = sys.argv[1:9]
batch, seq, warmup, steps = int(batch), int(seq), int(warmup), int(steps)
causal = causal == "1"
torch.cuda.init(); torch.zeros(1, device="cuda")
import subprocess
context = int(subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                              "-i", "0"], capture_output=True, text=True).stdout.split()[0]) * 2**20
context -= torch.cuda.memory_reserved()
torch.manual_seed(0)
config = AutoConfig.from_pretrained(cfg_dir)
net = (AutoModelForCausalLM if causal else
       AutoModelForSequenceClassification).from_config(config, attn_implementation="sdpa")
samples = batch * (warmup + steps)
ids = torch.randint(100, 30000, (samples, seq))
class DS(torch.utils.data.Dataset):
    def __len__(self): return samples
    def __getitem__(self, i):
        return {"input_ids": ids[i], "labels": ids[i] if causal else torch.tensor(0)}
class Clock(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        if state.global_step == warmup:
            torch.cuda.synchronize(); self.t0 = time.perf_counter()
    def on_train_end(self, args, state, control, **kw):
        torch.cuda.synchronize(); self.t1 = time.perf_counter()
clock = Clock()
args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=batch, bf16=True,
                         max_steps=warmup + steps, report_to="none", save_strategy="no",
                         logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
                         optim="adamw_torch_fused")
try:
    Trainer(model=net, args=args, train_dataset=DS(), callbacks=[clock]).train()
    # Outside the caching allocator, read after training: the context and the libraries' kernels.
    used = int(subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                               "-i", "0"], capture_output=True, text=True).stdout.split()[0]) * 2**20
    outside = max(context, used - torch.cuda.memory_reserved())
    row = {"samples_per_second": steps * batch / (clock.t1 - clock.t0),
           "gpu_memory": torch.cuda.max_memory_reserved() + outside}
except torch.OutOfMemoryError:
    row = {"error": "out of memory"}
print(json.dumps(dict(row, model=model, batch=batch, system="trainer")), flush=True)
'''


def last_json(p):
    rows = []
    for line in p.stdout.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass  # the Trainer's own printed metrics
    rows = [r for r in rows if isinstance(r, dict)]
    if not rows:
        return [{"error": (p.stderr.strip().splitlines() or ["failed"])[-1][:70]}]
    return rows


# brisk's timed steps per --steps: its runs' start-up varies by up to a second (two H200 calls
# gave 211 and 293 samples/s for one build over 3 x 10 steps), so the timed work is made longer:
# 10 x steps, and at least as many tokens as 10 x steps of 16384 tokens (bert-large batch 4
# timed over 10 x 10 steps took 1-2 s and read 577 samples/s on an H200 on 2026-11-28).
BRISK_TIMED = 10
BRISK_TIMED_TOKENS = 16384


def brisk_timed_steps(model, batch, steps):
    return BRISK_TIMED * steps * max(1, BRISK_TIMED_TOKENS // (batch * SEQ[model]))


def brisk_seconds(cfg, data, model, batch, steps, out, env=None, binary=None):
    cmd = [binary or BRISK, "train", "--device", "cuda", "--model", cfg, "--seq_len", str(SEQ[model]),
           "--max_steps", str(steps), "--per_device_train_batch_size", str(batch),
           "--bf16", "true", "--logging_steps", "1000000", "--save_strategy", "no",
           "--output_dir", out, "--disable_tqdm", "true"]
    cmd += ["--dataset", data] if model in CAUSAL else ["--dataset_size", str(batch * steps)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        return None, (p.stderr or p.stdout).strip().splitlines()[-1][:70]
    with open(os.path.join(out, "train_results.json")) as f:
        r = json.load(f)
    return (r["train_runtime"], r["memory"]["device_memory_used_bytes"], wall), None


def run_brisk(cfg, data, model, batch, a, tmp, env=None, binary=None):
    short, err = brisk_seconds(cfg, data, model, batch, a.warmup, os.path.join(tmp, "bs"), env,
                               binary)
    if err:
        return {"error": err}
    timed = brisk_timed_steps(model, batch, a.steps)
    full, err = brisk_seconds(cfg, data, model, batch, a.warmup + timed, os.path.join(tmp, "bf"),
                              env, binary)
    if err:
        return {"error": err}
    return {"samples_per_second": timed * batch / (full[0] - short[0]), "gpu_memory": full[1]}


def planned_device_bytes(cfg, model, batch, tmp):
    """brisk's plan of a bf16 GPU run of this batch (`brisk estimate --device cuda`, no GPU
    needed): its device buffers and its CUDA context, as check_plan_fits counts them."""
    out = os.path.join(tmp, "plan.json")
    p = subprocess.run([BRISK, "estimate", "--device", "cuda", "--model", cfg, "--seq_len",
                        str(SEQ[model]), "--per_device_train_batch_size", str(batch), "--bf16",
                        "true", "--output_json", out], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"brisk estimate failed: {(p.stderr or p.stdout).strip()[-200:]}")
    with open(out) as f:
        m = json.load(f)["memory"]
    return m["planned_device_bytes"] + m["device_context_bytes"]


def gpu_free_bytes():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits",
                          "-i", "0"], capture_output=True, text=True).stdout.split()
    if not out:
        sys.exit("--batches MODEL:fit needs nvidia-smi (or --fit_memory_gib)")
    return int(out[0]) * 2**20


def largest_fitting_batch(cfg, model, budget, tmp):
    """The largest batch, a multiple of 4, whose brisk plan fits `budget` bytes: the issue's
    "largest batch that fits", as brisk's own plan reads it."""
    fits = lambda b: planned_device_bytes(cfg, model, b, tmp) <= budget
    if not fits(4):
        sys.exit(f"{model}: not even batch 4 fits {budget / 2**30:.1f} GiB")
    lo, hi = 4, 8
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 4:  # lo fits, hi does not
        mid = (lo + hi) // 8 * 4
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--systems", default="brisk,torch,compile,trainer")
    ap.add_argument("--models", default="bert,gpt2")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--peak_tflops", type=float, default=989.0)
    ap.add_argument("--json", default="", help="also write the rows to this file")
    ap.add_argument("--batches", default="", help="batch sizes instead of the defaults, as "
                    "model:b1/b2,... (e.g. bert:32,gpt2:32); 'fit': the largest batch (a multiple "
                    "of 4) whose brisk plan fits the GPU's free memory (bert:32/fit)")
    ap.add_argument("--fit_memory_gib", type=float, default=0.0,
                    help="the memory 'fit' plans for (default: nvidia-smi's free memory)")
    ap.add_argument("--plan_only", action="store_true",
                    help="print the batches (with 'fit' resolved) and stop; needs no GPU")
    a = ap.parse_args()
    for item in filter(None, a.batches.split(",")):
        model, sizes = item.split(":")
        BATCHES[model] = tuple(b if b == "fit" else int(b) for b in sizes.split("/"))
    systems, models = a.systems.split(","), a.models.split(",")
    known = {"brisk", "brisk-base", "torch", "compile", "trainer", *SWITCHED}
    unknown = [s for s in systems if s not in known]
    if unknown:
        sys.exit(f"unknown --systems {','.join(unknown)} (known: {','.join(sorted(known))})")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cfgs = {m: write_config(os.path.join(tmp, m), CONFIGS[m]) for m in models}
        if any("fit" in BATCHES[m] for m in models):
            budget = a.fit_memory_gib * 2**30 if a.fit_memory_gib > 0 else gpu_free_bytes()
            for m in models:
                BATCHES[m] = tuple(largest_fitting_batch(cfgs[m], m, budget, tmp)
                                   if b == "fit" else b for b in BATCHES[m])
        if a.plan_only:
            for m in models:
                print(m, "batches", "/".join(str(b) for b in BATCHES[m]), "planned GiB",
                      "/".join(f"{planned_device_bytes(cfgs[m], m, b, tmp) / 2**30:.2f}"
                               for b in BATCHES[m]))
            return
        data = os.path.join(tmp, "tokens.bin")
        causal = [m for m in models if m in CAUSAL]
        if causal:  # ids below 30000: within every vocabulary here
            tokens = max(b * SEQ[m] * (a.warmup + brisk_timed_steps(m, b, a.steps))
                         for m in causal for b in BATCHES[m])
            write_tokens(data, tokens + 1)
        for model in models:
            for system in systems:
                if system in ("torch", "compile"):
                    p = subprocess.run([sys.executable, "-c", TORCH_CHILD, cfgs[model], model,
                                        system, json.dumps(BATCHES[model]), str(SEQ[model]),
                                        str(a.warmup), str(a.steps), str(int(model in CAUSAL))],
                                       capture_output=True, text=True)
                    got = last_json(p)
                    got = [dict(g, model=model, system=system) for g in got]
                    if len(got) == 1 and "batch" not in got[0]:
                        got = [dict(got[0], batch=b) for b in BATCHES[model]]
                else:
                    got = []
                    for batch in BATCHES[model]:
                        if system in SWITCHED:  # this build with a measurement switch
                            r = run_brisk(cfgs[model], data, model, batch, a, tmp,
                                          dict(os.environ, **SWITCHED[system]))
                        elif system == "brisk-base":  # another build: $BRISK_BASE_BIN
                            r = run_brisk(cfgs[model], data, model, batch, a, tmp,
                                          binary=os.environ["BRISK_BASE_BIN"])
                        elif system == "brisk":
                            r = run_brisk(cfgs[model], data, model, batch, a, tmp)
                        else:
                            p = subprocess.run([sys.executable, "-c", TRAINER_CHILD, cfgs[model],
                                                os.path.join(tmp, "hf"), model, str(batch),
                                                str(SEQ[model]), str(a.warmup), str(a.steps),
                                                str(int(model in CAUSAL))],
                                               capture_output=True, text=True)
                            r = last_json(p)[-1]
                        got.append(dict(r, model=model, batch=batch, system=system))
                for g in got:
                    print(json.dumps(g), flush=True)
                rows += got
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    print_table(rows, systems, a.peak_tflops)


def head_flops_per_token(model):
    """The LM head's three products per token (6 V C) for the causal LMs; the classifier's are
    negligible."""
    c = CONFIGS[model]
    return 6 * c["vocab_size"] * c.get("hidden_size", c.get("n_embd")) if model in CAUSAL else 0


def print_table(rows, systems, peak):
    print(f"\n{'model':<12}{'batch':>6}" + "".join(
        f"{s + ' /s':>14}{'MFU':>6}{'+head':>6}{'GiB':>7}" for s in systems))
    keys = sorted({(r["model"], r["batch"]) for r in rows}, key=lambda k: (k[0], k[1]))
    for model, batch in keys:
        line = f"{model:<12}{batch:>6}"
        for s in systems:
            r = next((r for r in rows if (r["model"], r["batch"], r["system"]) ==
                      (model, batch, s)), {})
            if "samples_per_second" not in r:
                line += f"{r.get('error', 'n/a')[:32]:>33}"
                continue
            tokens = r["samples_per_second"] * SEQ[model]
            blocks = flops_per_token(CONFIGS[model], SEQ[model])
            mfu = tokens * blocks / (peak * 1e12)
            with_head = tokens * (blocks + head_flops_per_token(model)) / (peak * 1e12)
            line += (f"{r['samples_per_second']:>14.1f}{100 * mfu:>5.1f}%{100 * with_head:>5.1f}%"
                     f"{r['gpu_memory'] / 2**30:>7.2f}")
        print(line)


if __name__ == "__main__":
    main()
