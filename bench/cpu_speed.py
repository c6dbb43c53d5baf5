#!/usr/bin/env python3
"""CPU speed at the machine's limit (issue 15): brisk, a plain PyTorch training loop, the same
loop under torch.compile and transformers' Trainer, in one invocation on this machine, for

  bert     BERT 4 x 256 (intermediate 1024, sequence classification), batch 8 x 128
  gpt2     GPT-2 124M (causal LM), batch 4 x 256
  smollm2  SmolLM2-135M's architecture (Llama: 30 x 576, 9 query / 3 key-value heads), batch 4 x 256
  mixtral  a small Mixtral (4 x 512, 8 experts of 1024, top 2, the load-balancing loss), 4 x 256
  mixtral_dense  the llama of its active size (an MLP of 2048), 4 x 256

each in fp32 and bf16 (autocast in the PyTorch loops, as Trainer), dropout 0, AdamW, random
tokens, weights initialized from the config. Prints samples/s (the PyTorch loops after their
warm-up steps, where torch.compile compiles; brisk and Trainer over the whole run), the peak
process memory, and model FLOP/s as a fraction of the machine's float32 and bf16 matrix-product
peaks measured in the same invocation (build/bench_matmul --peak: the best of large square
products, read before and after the runs, the higher reading taken; the header line adds the
instruction ceilings those products run under, for reference). Model FLOPs per token: 6 x the
weights of the matrix products (blocks and LM head) + 12 x layers x sequence x hidden for
attention (QK^T and PV, forward and backward, unmasked).

Run (after scripts/build.sh, `cmake --build build --target bench_matmul` and
scripts/setup_python.sh):
    .venv/bin/python bench/cpu_speed.py [--rows bert,gpt2,smollm2] [--precisions fp32,bf16]
                                        [--only brisk,torch,compile,trainer] [--steps N]
                                        [--repeat N]

With --repeat N each row's runs take turns N times (brisk, torch, compile, ..., then again), so
that a slow minute of a shared machine falls on all of them; the table gives each run's median
samples/s with its range, the ratio of the medians with the range of the ratios of runs made side
by side, and the largest peak memory.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from common import cpu_name, run_child

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BRISK = os.environ.get("BRISK_BIN", os.path.join(ROOT, "build", "brisk"))
MATMUL = os.path.join(ROOT, "build", "bench_matmul")

MODELS = {
    "bert": {"config": {
        "model_type": "bert", "architectures": ["BertForSequenceClassification"],
        "vocab_size": 30522, "hidden_size": 256, "num_hidden_layers": 4,
        "num_attention_heads": 4, "intermediate_size": 1024, "max_position_embeddings": 512,
        "type_vocab_size": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0, "layer_norm_eps": 1e-12,
        "id2label": {"0": "LABEL_0", "1": "LABEL_1"}, "label2id": {"LABEL_0": 0, "LABEL_1": 1}},
        "batch": 8, "seq": 128, "steps": 30},
    "gpt2": {"config": {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 50257,
        "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, "n_inner": None,
        "activation_function": "gelu_new", "resid_pdrop": 0.0, "embd_pdrop": 0.0,
        "attn_pdrop": 0.0, "layer_norm_epsilon": 1e-5, "initializer_range": 0.02,
        "bos_token_id": 50256, "eos_token_id": 50256, "tie_word_embeddings": True},
        "batch": 4, "seq": 256, "steps": 8},
    "smollm2": {"config": {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 49152,
        "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "intermediate_size": 1536, "max_position_embeddings": 8192,
        "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "hidden_act": "silu",
        "initializer_range": 0.02, "tie_word_embeddings": True, "attention_dropout": 0.0},
        "batch": 4, "seq": 256, "steps": 8},
    # A small Mixtral (8 experts, top 2) and the dense llama of
    # the same active size (its MLP as wide as the two experts a token runs through).
    "mixtral": {"config": {
        "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "vocab_size": 32000,
        "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
        "num_key_value_heads": 4, "intermediate_size": 1024, "num_local_experts": 8,
        "num_experts_per_tok": 2, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5,
        "hidden_act": "silu", "initializer_range": 0.02, "tie_word_embeddings": False,
        "attention_dropout": 0.0, "output_router_logits": True, "router_aux_loss_coef": 0.02},
        "batch": 4, "seq": 256, "steps": 8},
    "mixtral_dense": {"config": {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 32000,
        "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
        "num_key_value_heads": 4, "intermediate_size": 2048, "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-5, "hidden_act": "silu", "initializer_range": 0.02,
        "tie_word_embeddings": False, "attention_dropout": 0.0},
        "batch": 4, "seq": 256, "steps": 8},
}

PY_CHILD = r'''
import contextlib, json, resource, sys, time
import numpy as np, torch
from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification,
                          Trainer, TrainingArguments, logging)
logging.set_verbosity_error()
mode, precision, cfg_dir, out_dir, steps, warmup, batch, seq = sys.argv[1:9]
steps, warmup, batch, seq = int(steps), int(warmup), int(batch), int(seq)
bf16 = precision == "bf16"
torch.manual_seed(42)
cfg = AutoConfig.from_pretrained(cfg_dir)
causal = cfg.model_type != "bert"
kw = {"attn_implementation": "sdpa"}
model = (AutoModelForCausalLM if causal else AutoModelForSequenceClassification).from_config(cfg, **kw)
rng = np.random.default_rng(42)
total = steps + warmup
ids = torch.tensor(rng.integers(100, 30000, (total * batch, seq)))
rows = [{"input_ids": ids[i], "labels": ids[i] if causal else torch.tensor(int(ids[i, 0]) % 2)}
        for i in range(total * batch)]
if mode == "trainer":
    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=batch,
                             max_steps=steps, report_to="none", save_strategy="no",
                             logging_strategy="no", use_cpu=True, bf16=bf16,
                             dataloader_num_workers=0, disable_tqdm=True, seed=42)
    result = Trainer(model=model, args=args, train_dataset=rows[:steps * batch]).train()
    out = {"samples_per_second": result.metrics["train_samples_per_second"]}
else:
    step_model = torch.compile(model) if mode == "compile" else model
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.0)
    model.train()
    for i in range(total):
        if i == warmup: start = time.perf_counter()
        b = rows[i * batch:(i + 1) * batch]
        inputs = {k: torch.stack([r[k] for r in b]) for k in b[0]}
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with ctx:
            loss = step_model(**inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step(); opt.zero_grad()
        loss.item()
    out = {"samples_per_second": steps * batch / (time.perf_counter() - start)}
out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
out["threads"] = torch.get_num_threads()
print(json.dumps(out))
'''


def flops_per_sample(cfg, seq):
    """6 x matrix-product weights per token + attention, times the tokens of one sample."""
    if cfg["model_type"] == "gpt2":
        c, layers, inter = cfg["n_embd"], cfg["n_layer"], 4 * cfg["n_embd"]
        block = 4 * c * c + 2 * c * inter
        head = c * cfg["vocab_size"]
    elif cfg["model_type"] == "bert":
        c, layers, inter = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
        block = 4 * c * c + 2 * c * inter
        head = 0  # the pooler and classifier see one token per sample: negligible
    else:  # llama, and mixtral's active experts (top k of them per token) and router
        c, layers, inter = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
        kv = c // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
        experts = cfg.get("num_local_experts", 0)
        active = inter * (cfg["num_experts_per_tok"] if experts else 1)
        block = 2 * c * c + 2 * c * kv + 3 * c * active + c * experts
        head = c * cfg["vocab_size"]
    per_token = 6 * (layers * block + head) + 12 * layers * seq * c
    return per_token * seq


def write_config(tmp, row):
    """The row's config.json in a folder of its own under tmp; returns the folder."""
    cfg_dir = os.path.join(tmp, row)
    os.makedirs(cfg_dir)
    with open(os.path.join(cfg_dir, "config.json"), "w") as f:
        json.dump(MODELS[row]["config"], f)
    return cfg_dir


def brisk_command(cfg_dir, out_dir, precision, m, steps, brisk=BRISK, optim="adamw_torch"):
    """brisk train on the row's workload: random tokens, AdamW (or `optim`), no checkpoints."""
    return [brisk, "train", "--model", cfg_dir, "--per_device_train_batch_size", str(m["batch"]),
            "--seq_len", str(m["seq"]), "--dataset_size", str(steps * m["batch"]),
            "--max_steps", str(steps), "--logging_steps", str(steps), "--save_strategy", "no",
            "--output_dir", out_dir, "--device", "cpu", "--optim", optim,
            "--disable_tqdm", "--bf16", "true" if precision == "bf16" else "false",
            "--fp16", "true" if precision == "fp16" else "false"]


def run_brisk(cfg_dir, out_dir, precision, m, steps, brisk=BRISK, optim="adamw_torch", env=None):
    cmd = brisk_command(cfg_dir, out_dir, precision, m, steps, brisk, optim)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL,
                   env=dict(os.environ, **(env or {})))
    with open(os.path.join(out_dir, "train_results.json")) as f:
        r = json.load(f)
    return {"samples_per_second": r["train_samples_per_second"],
            "peak_rss": r["memory"]["peak_rss_bytes"]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="bert,gpt2,smollm2")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--only", default="brisk,torch,compile,trainer")
    p.add_argument("--steps", type=int, default=0, help="steps per run (default: per model)")
    p.add_argument("--warmup", type=int, default=2, help="PyTorch loops' untimed first steps")
    p.add_argument("--repeat", type=int, default=1, help="runs of each, taking turns")
    a = p.parse_args()
    if a.repeat < 1:
        p.error("--repeat must be at least 1")
    if not os.path.exists(MATMUL):
        sys.exit(f"{MATMUL} is missing: cmake --build build --target bench_matmul")
    env = dict(os.environ, OMP_NUM_THREADS=str(os.cpu_count()))

    def measure_peak():
        return json.loads(subprocess.run([MATMUL, "--peak"], check=True, capture_output=True,
                                         text=True, env=env).stdout)

    first_peak = measure_peak()
    print("peak", json.dumps(first_peak), flush=True)
    results = {}  # (row, precision, name) -> one result per repetition
    with tempfile.TemporaryDirectory() as tmp:
        for row in a.rows.split(","):
            m = MODELS[row]
            steps = a.steps or m["steps"]
            cfg_dir = write_config(tmp, row)
            for precision in a.precisions.split(","):
                for rep in range(a.repeat):
                    for name in a.only.split(","):
                        out = os.path.join(tmp, f"{row}-{precision}-{name}-{rep}")
                        r = (run_brisk(cfg_dir, out, precision, m, steps) if name == "brisk" else
                             run_child(PY_CHILD, name, precision, cfg_dir, out, steps, a.warmup,
                                       m["batch"], m["seq"]))
                        results.setdefault((row, precision, name), []).append(r)
                        print(row, precision, name, json.dumps(r), flush=True)
    # The peaks read again after the runs, and the higher reading of each taken: a VM's slow
    # minute during one reading moved them by 10-12% (so the fractions below are conservative).
    last_peak = measure_peak()
    print("peak", json.dumps(last_peak), flush=True)
    peak = {k: max(v, last_peak.get(k, v)) for k, v in first_peak.items()}
    print(f"\nCPU: {cpu_name()}, {os.cpu_count()} threads; matrix-product peaks "
          f"{peak['fp32_gflops']:.0f} GFLOP/s float32, {peak['bf16_gflops']:.0f} GFLOP/s bf16 "
          f"(instruction ceilings {peak['fp32_fma_ceiling_gflops']:.0f} and "
          f"{peak['bf16_dot_ceiling_gflops']:.0f})")
    if a.repeat > 1:
        print(f"Medians of {a.repeat} runs each, taking turns; (ranges)")
    print("| workload | precision | run | samples/s | vs compile | peak memory | vs compile | "
          "model GFLOP/s | of fp32 peak | of bf16 peak |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (row, precision, name), runs in results.items():
        m = MODELS[row]
        label = f"{row} {m['batch']} x {m['seq']}"
        rates = [r["samples_per_second"] for r in runs]
        rate, memory = statistics.median(rates), max(r["peak_rss"] for r in runs)
        gflops = rate * flops_per_sample(m["config"], m["seq"]) * 1e-9
        shown = f"{rate:.2f}" + (f" ({min(rates):.2f}-{max(rates):.2f})" if len(runs) > 1 else "")
        base = results.get((row, precision, "compile"))
        speed = mem = "-"
        if base and name != "compile":
            base_rates = [r["samples_per_second"] for r in base]
            speed = f"{rate / statistics.median(base_rates):.2f}x"
            if len(runs) > 1:  # each run against the compile run beside it
                paired = [x / y for x, y in zip(rates, base_rates)]
                speed += f" ({min(paired):.2f}-{max(paired):.2f})"
            mem = f"{memory / max(r['peak_rss'] for r in base):.2f}x"
        bf16_frac = f"{gflops / peak['bf16_gflops']:.0%}" if peak["bf16_gflops"] else "n/a"
        print(f"| {label} | {precision} | {name} | {shown} | {speed} | "
              f"{memory / 2**20:.0f} MiB | {mem} | {gflops:.0f} | "
              f"{gflops / peak['fp32_gflops']:.0%} | {bf16_frac} |")


if __name__ == "__main__":
    main()
