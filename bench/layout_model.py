"""A model of larger runs than this machine: for GPT-2 1.5B's, Llama 7B's and Llama 70B's shapes on
8 to 1,024 H100s of 80 GB, which layouts fit and the one `brisk estimate --device cuda --bf16
--fit --world_size N --max_memory 80GB` ranks first (tensor-parallel degree x pipeline depth x
sequence-parallel degree x data replicas x ZeRO stage x batch split x recomputation), its predicted step and the MFU that implies (6 x
parameters x tokens per step over N x 989 TFLOP/s, the H100 SXM's dense bf16 peak). The global
batch is 4 sequences per GPU. Not a measurement: brisk's cost model (src/train/fit.cpp,
docs/memory.md), which prices every sum across ranks at one collective rate (360 GB/s, NVLink 4
within a node) and hides none of them behind computation.

    python3 bench/layout_model.py [--ranks 8,64,256,1024]
"""
import argparse
import json
import os
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BRISK = os.environ.get("BRISK_BIN", os.path.join(ROOT, "build", "brisk"))
PEAK = 989e12  # H100 SXM, dense bf16
CONFIGS = {
    "gpt2-1.5b": {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 1600, "n_layer": 48,
                  "n_head": 25, "n_positions": 1024},
    "llama-70b": {"model_type": "llama", "vocab_size": 32000, "hidden_size": 8192,
                  "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
                  "intermediate_size": 28672, "max_position_embeddings": 4096,
                  "tie_word_embeddings": False},
}
MODELS = [("gpt2-1.5b", 1024), ("llama-2-7b", 4096), ("llama-70b", 4096)]


def model_path(name, tmp):
    if name not in CONFIGS:
        return name  # built in
    folder = os.path.join(tmp, name)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(CONFIGS[name], f)
    return folder


def fit(model, seq, ranks, tmp):
    out = os.path.join(tmp, "fit.json")
    r = subprocess.run([BRISK, "estimate", "--device", "cuda", "--bf16", "--model_name_or_path",
                        model, "--seq_len", str(seq), "--per_device_train_batch_size", "1",
                        "--gradient_accumulation_steps", "4", "--world_size", str(ranks),
                        "--dataset_size", str(8 * ranks),  # two global batches
                        "--fit", "--max_memory", "80GB", "--fit_optims", "adamw_torch",
                        "--output_json", out], capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip().splitlines()[-1], 0
    j = json.load(open(out))
    return j["fit"], None, j["parameters"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", default="8,64,256,1024")
    a = p.parse_args()
    print("| model | GPUs | layouts that fit | first: layout | batch x accum | recompute "
          "| needs / GPU | predicted step | MFU | tp 1, pp 1, sp 1, ZeRO 0 fits |")
    print("|---|---:|---:|---|---|---|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, seq in MODELS:
            model = model_path(name, tmp)
            for n in (int(x) for x in a.ranks.split(",")):
                fits, error, params = fit(model, seq, n, tmp)  # the plan printed: tp 1
                if fits is None:
                    print(f"| {name} | {n} | none: {error} | | | | | | | |")
                    continue
                best = fits[0]
                tp, pp, dp = best["tp_size"], best["pp_size"], best["data_ranks"]
                sp = best.get("sp_size", 1)
                tokens = 4 * n * seq
                mfu = 6 * params * tokens / (best["predicted_step_seconds"] * n * PEAK)
                layouts = {(c["tp_size"], c["pp_size"], c.get("sp_size", 1), c["data_ranks"],
                            c["zero_stage"]) for c in fits}
                plain = any(c["tp_size"] == 1 and c["pp_size"] == 1 and c.get("sp_size", 1) == 1
                            and c["zero_stage"] == 0 for c in fits)
                recompute = ("full" if best["gradient_checkpointing"] else
                             "selective" if best["selective_recompute"] else "none")
                print(f"| {name} (s {seq}) | {n} | {len(layouts)} "
                      f"| tp {tp} x pp {pp} x sp {sp} x dp {dp}, "
                      f"ZeRO {best['zero_stage'] if dp * sp > 1 else 0} "
                      f"| {best['per_device_train_batch_size']} x "
                      f"{best['gradient_accumulation_steps']} | {recompute} "
                      f"| {best['needed_bytes'] / 2**30:.1f} GiB "
                      f"| {best['predicted_step_seconds']:.2f} s | {mfu:.0%} "
                      f"| {'yes' if plain else 'no'} |")


if __name__ == "__main__":
    main()
