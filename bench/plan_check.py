#!/usr/bin/env python3
"""The memory plan against the process: for bert-small, bert-base and GPT-2 124M, fp32 and bf16,
recomputation none, selective and full, brisk's planned bytes (the gradients laid over consumed
activations counted once; those bytes beside them), the resident memory before the arena,
and the measured process peak (2 steps and a checkpoint save), with the ratio and issue 10's bound
(peak <= plan + before + max(2%, 32 MiB)). Then `brisk estimate --fit` for one budget, its top
three configurations run for real: is the predicted order the measured order?

Needs only the brisk binary (scripts/build.sh); CPU runs.
    python3 bench/plan_check.py [--steps 2] [--fit_steps 8]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BRISK = os.environ.get("BRISK_BIN", os.path.join(ROOT, "build", "brisk"))

BERT_SMALL = {"model_type": "bert", "vocab_size": 30522, "hidden_size": 256,
              "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024,
              "max_position_embeddings": 512, "type_vocab_size": 2}
MiB = 2 ** 20


def brisk(args):
    p = subprocess.run([BRISK] + args, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"brisk {' '.join(args)} failed: {p.stderr.strip()}")
    return p.stdout


def plan_rows(tmp, steps):
    small = os.path.join(tmp, "bert-small")
    os.makedirs(small, exist_ok=True)
    with open(os.path.join(small, "config.json"), "w") as f:
        json.dump(BERT_SMALL, f)
    models = [("bert-small", small, 8), ("bert-base", "bert-base-uncased", 4), ("gpt2-124M", "gpt2", 4)]
    print(f"{'model':<11}{'prec':<6}{'ckpt':<10}{'planned':>11}{'overlaid':>11}{'before':>10}{'peak':>11}"
          f"{'steps pk':>11}{'saves pk':>11}{'peak/(plan+before)':>20}{'bound':>7}")
    for name, model, batch in models:
        for prec in ("fp32", "bf16"):
            for ckpt in ("none", "selective", "full"):
                out = os.path.join(tmp, "run")
                args = ["train", "--device", "cpu", "--model", model, "--seq_len", "128",
                        "--per_device_train_batch_size", str(batch), "--max_steps", str(steps),
                        "--dataset_size", "64", "--save_steps", "0", "--output_dir", out,
                        "--disable_tqdm", "--logging_steps", "1000"]
                if prec == "bf16":
                    args.append("--bf16")
                if ckpt == "full":
                    args.append("--gradient_checkpointing")
                if ckpt == "selective":
                    args.append("--selective_recompute")
                brisk(args)
                with open(os.path.join(out, "train_results.json")) as f:
                    m = json.load(f)["memory"]
                # The gradients laid over consumed activations count once.
                planned = sum(m["planned_bytes"].values()) - m.get("overlaid_bytes", 0)
                before, peak = m["rss_before_arena_bytes"], m["peak_rss_bytes"]
                bound = planned + before + max(planned // 50, 32 * MiB)
                print(f"{name:<11}{prec:<6}{ckpt:<10}{planned / MiB:>9.1f}Mi"
                      f"{m.get('overlaid_bytes', 0) / MiB:>9.1f}Mi{before / MiB:>8.1f}Mi"
                      f"{peak / MiB:>9.1f}Mi{m['peak_rss_steps_bytes'] / MiB:>9.1f}Mi"
                      f"{m['peak_rss_saves_bytes'] / MiB:>9.1f}Mi{peak / (planned + before):>20.3f}"
                      f"{'ok' if peak <= bound else 'OVER':>7}", flush=True)
                subprocess.run(["rm", "-rf", out])


def fit_rows(tmp, steps):
    small = os.path.join(tmp, "bert-small")
    base = ["--device", "cpu", "--model", small, "--seq_len", "128"]
    shape = ["--per_device_train_batch_size", "16", "--gradient_accumulation_steps", "1"]
    fit_json = os.path.join(tmp, "fit.json")
    budget = "700MiB"
    brisk(["estimate"] + base + shape + ["--fit", "--max_memory", budget, "--fit_precisions", "fp32,bf16",
                                 "--fit_optims", "adamw_torch,adafactor", "--output_json", fit_json])
    with open(fit_json) as f:
        fits = json.load(f)["fit"]
    print(f"\nestimate --fit, global batch 16 x 128 tokens, budget {budget}: {len(fits)} fit; "
          f"the top three run for {steps} steps")
    print(f"{'rank':<6}{'batch x accum':<15}{'recompute':<10}{'prec':<6}{'optim':<13}{'needs':>10}"
          f"{'predicted':>12}{'measured':>11}{'peak':>10}")
    measured = []
    for i, c in enumerate(fits[:3]):
        out = os.path.join(tmp, f"fit{i}")
        args = ["train"] + base + ["--per_device_train_batch_size", str(c["per_device_train_batch_size"]),
                                   "--gradient_accumulation_steps", str(c["gradient_accumulation_steps"]),
                                   "--optim", c["optim"], "--max_steps", str(steps),
                                   "--dataset_size", "256", "--save_strategy", "no",
                                   "--output_dir", out, "--disable_tqdm", "--logging_steps", "1000"]
        if c["gradient_checkpointing"]:
            args.append("--gradient_checkpointing")
        if c["selective_recompute"]:
            args.append("--selective_recompute")
        if c["precision"] == "bf16":
            args.append("--bf16")
        brisk(args)
        with open(os.path.join(out, "train_results.json")) as f:
            r = json.load(f)
        ms = 1e3 / r["train_steps_per_second"]
        measured.append(ms)
        print(f"{i + 1:<6}{str(c['per_device_train_batch_size']) + ' x ' + str(c['gradient_accumulation_steps']):<15}"
              f"{'full' if c['gradient_checkpointing'] else 'selective' if c['selective_recompute'] else 'none':<10}{c['precision']:<6}{c['optim']:<13}"
              f"{c['needed_bytes'] / MiB:>8.1f}Mi{c['predicted_step_seconds'] * 1e3:>10.1f}ms"
              f"{ms:>9.1f}ms{r['memory']['peak_rss_bytes'] / MiB:>8.1f}Mi", flush=True)
    same = measured == sorted(measured)
    print(f"predicted order {'is' if same else 'is NOT'} the measured order")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--fit_steps", type=int, default=8)
    ap.add_argument("--only_fit", action="store_true", help="skip the plan-vs-peak rows")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if not a.only_fit:
            plan_rows(tmp, a.steps)
        else:
            os.makedirs(os.path.join(tmp, "bert-small"), exist_ok=True)
            with open(os.path.join(tmp, "bert-small", "config.json"), "w") as f:
                json.dump(BERT_SMALL, f)
        fit_rows(tmp, a.fit_steps)


if __name__ == "__main__":
    main()
