"""Expert parallelism's memory per rank and what its all-to-alls pass: brisk's plan of expert rank
0 (`brisk estimate --ep_size e --world_size e --bf16`) for cpu_speed.py's small Mixtral and a
Mixtral with 8x7B's shape: the model states each rank holds (the experts' split e ways, the rest
whole), the rows its experts may receive per sparse layer and micro-batch (the bound their
buffers are planned for) and the activations. Then a measured run on this machine's CPU: the
small Mixtral on 2 ranks of one thread each (mpirun), plain data parallelism against --ep_size 2,
the same global batch: step speed, loss, the planned bytes, rank 0's peak, and the bytes rank 0
passed to the experts' all-to-alls per step (expert_all_to_all_bytes).

    python3 bench/ep_plan.py [--max_steps 4] [--batch 2] [--seq 256]
"""
import argparse
import json
import os
import subprocess
import tempfile

from common import BRISK, MPI_ENV, cpu_name
from cpu_speed import MODELS

MIB = 2**20
# Mixtral 8x7B's shape (transformers' MixtralConfig defaults).
MIXTRAL_8X7B = {
    "model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
    "max_position_embeddings": 32768, "tie_word_embeddings": False}


def write_model(tmp, name, config):
    folder = os.path.join(tmp, name)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return folder


def estimate(folder, ep, batch, seq, capacity, tmp):
    out = os.path.join(tmp, f"estimate_{os.path.basename(folder)}_{ep}_{capacity}.json")
    subprocess.run([BRISK, "estimate", "--model_name_or_path", folder, "--ep_size", str(ep),
                    "--world_size", str(ep), "--per_device_train_batch_size", str(batch),
                    "--seq_len", str(seq), "--bf16", "--output_json", out,
                    "--moe_capacity_factor", str(capacity)],
                   check=True, capture_output=True, text=True)
    return json.load(open(out))


def plan_table(models, tmp):
    states = ("weights", "master_weights", "gradients", "optimizer_state")
    print("| model | ep | capacity factor | parameters / rank | experts' / rank "
          "| model states / rank | rows received (bound) | activations / rank | total / rank |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, folder, batch, seq in models:
        for ep, capacity in ((1, 0), (2, 0), (4, 0), (8, 0), (2, 1.25), (8, 1.25)):
            j = estimate(folder, ep, batch, seq, capacity, tmp)
            planned = j["memory"]["planned_bytes"]
            held = sum(planned[k] for k in states)
            rows = j["expert_parallel"].get("receive_rows_bound", batch * seq * 2)
            print(f"| {name} b{batch} s{seq} | {ep} | {capacity or 'dropless'} "
                  f"| {j['parameters'] / 1e6:.1f}M "
                  f"| {j['expert_parameters'] / 1e6:.1f}M | {held / MIB:.0f} MiB | {rows} "
                  f"| {planned['activations'] / MIB:.0f} MiB "
                  f"| {j['memory']['planned_total_bytes'] / MIB:.0f} MiB |")


def train(folder, ep, capacity, a, out):
    """bf16 on 2 ranks of one thread each; returns train_results.json."""
    args = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", BRISK, "train",
            "--model_name_or_path", folder, "--ep_size", str(ep),
            "--per_device_train_batch_size", str(a.batch), "--seq_len", str(a.seq),
            "--max_steps", str(a.max_steps), "--logging_steps", str(a.max_steps),
            "--output_dir", out, "--disable_tqdm", "--save_strategy", "no", "--bf16",
            "--dataset_size", str(2 * a.batch * a.max_steps), "--moe_capacity_factor",
            str(capacity)]
    subprocess.run(args, check=True, env=dict(MPI_ENV, OMP_NUM_THREADS="1"), capture_output=True,
                   text=True)
    return json.load(open(os.path.join(out, "train_results.json")))


def measured_table(folder, a, tmp):
    print(f"\nmixtral (cpu_speed.py's), 2 ranks x 1 thread, batch {a.batch} x {a.seq} per rank, "
          f"bf16, {a.max_steps} steps, {cpu_name()}, {os.cpu_count()} cores")
    print("| layout | samples/s | loss | planned / rank | rank 0's peak RSS "
          "| all-to-all bytes / step (rank 0) | all-to-alls' share of the run "
          "| all communication's share |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for ep, capacity in ((1, 0), (2, 0), (1, 1.25), (2, 1.25)):
        r = train(folder, ep, capacity, a, os.path.join(tmp, f"ep{ep}_{capacity}"))
        mem = r["memory"]
        passed = r.get("expert_all_to_all_bytes", 0) / a.max_steps
        layout = "data parallel" if ep == 1 else "ep 2"
        print(f"| {layout}{f', capacity {capacity}' if capacity else ''} "
              f"| {r['train_samples_per_second']:.2f} | {r['train_loss']:.4f} "
              f"| {sum(mem['planned_bytes'].values()) / MIB:.0f} MiB "
              f"| {mem['peak_rss_bytes'] / MIB:.0f} MiB | {passed / MIB:.1f} MiB "
              f"| {r.get('expert_all_to_all_seconds', 0) / r['train_runtime']:.0%} "
              f"| {r['communication_seconds'] / r['train_runtime']:.0%} |")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--max_steps", type=int, default=4)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        small = write_model(tmp, "mixtral", MODELS["mixtral"]["config"])
        big = write_model(tmp, "mixtral-8x7b", MIXTRAL_8X7B)
        plan_table([("mixtral", small, 4, 256), ("mixtral-8x7b", big, 1, 4096)], tmp)
        measured_table(small, a, tmp)


if __name__ == "__main__":
    main()
