"""A model of data-parallel runs larger than this machine: per-step communication per rank and its
time at stated link bandwidths, and the model states each rank holds, for DDP and ZeRO stages
1-3, next to the ZeRO paper's formulas (Rajbhandari et al. 2020) and, where brisk implements
the stage, brisk's own plan of a GPU run (`brisk estimate --device cuda --bf16 --world_size N
--zero_stage k`).

    python3 bench/zero_model.py [--models gpt2,gpt2-medium,llama-2-7b] [--ranks 8,64,256,1024]

Communication (ring collectives, latency ignored): an all-reduce moves 2 (N-1)/N x the buffer per
rank (a reduce-scatter then an all-gather); DDP and ZeRO 1 and 2 sum the gradients once per step
(2 Psi elements), ZeRO 3 also gathers the weights for forward and again for backward (3 Psi).
The paper sums 16-bit gradients (2 bytes); brisk sums float32 gradients today (4 bytes).
Model states per rank, mixed-precision Adam (K = 12 bytes of optimizer state per parameter:
float32 master, momentum, variance): DDP (2 + 2 + K) Psi, stage 1 (2 + 2) Psi + K Psi / N,
stage 2 2 Psi + (2 + K) Psi / N, stage 3 (2 + 2 + K) Psi / N.
With offload_optimizer cpu (ZeRO-Offload), brisk's plan keeps each rank's run of the master
copy and optimizer state in host memory with a float32 copy of its run of the gradients: the
last column splits rank 0's model states into GPU / host, and the host link moves 4 Psi / N bytes
each way per step (gradients down, master up), timed at PCIE below.
"""
import argparse
import json
import os
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BRISK = os.environ.get("BRISK_BIN", os.path.join(ROOT, "build", "brisk"))
LINKS = {"100 Gb/s Ethernet": 12.5e9, "400 Gb/s InfiniBand": 50e9}  # bytes/s per rank
K = 12
PCIE = 25e9  # bytes/s each way: a PCIe 4.0 x16 link's practical rate
STATES = ("weights", "master_weights", "gradients", "optimizer_state")


def paper_bytes_per_param(stage, n):
    return {0: 2 + 2 + K, 1: 4 + K / n, 2: 2 + (2 + K) / n, 3: (4 + K) / n}[stage]


def comm_elements(stage, n, psi):
    ring = 2 * (n - 1) / n  # an all-reduce's share per rank, in buffers
    return psi * (ring if stage < 3 else 1.5 * ring)


def brisk_plan(model, n, stage, offload=False):
    """Rank 0's planned model states (bytes) on the GPU and in host memory, and the parameter
    count, from brisk estimate."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "plan.json")
        subprocess.run([BRISK, "estimate", "--model", model, "--bf16", "--device", "cuda",
                        "--world_size", str(n),
                        "--zero_stage", str(stage), "--per_device_train_batch_size", "1",
                        "--seq_len", "128", "--dataset_size", str(n), "--output_json", out,
                        "--offload_optimizer", "cpu" if offload else "none"],
                       check=True, capture_output=True, text=True)
        j = json.load(open(out))
    gpu = host = 0
    for b in j["memory"]["buffers"]:
        if b["category"] in STATES:
            if b["placement"] == "host":
                host += b["bytes"]
            else:
                gpu += b["bytes"]
    return gpu, host, j["parameters"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="gpt2,gpt2-medium,llama-2-7b")
    p.add_argument("--ranks", default="8,64,256,1024")
    a = p.parse_args()
    # The formulas against the paper's own example (7.5B parameters on 64 GPUs, in GB: 120,
    # 31.4, 16.6, 1.88 for DDP and stages 1, 2, 3).
    example = [paper_bytes_per_param(stage, 64) * 7.5e9 / 1e9 for stage in range(4)]
    print("formulas at the paper's example, 7.5B parameters on 64 ranks: "
          + ", ".join(f"stage {k}: {gb:.3g} GB" for k, gb in enumerate(example)) + "\n")
    links = list(LINKS.items())
    print("| model | ranks | stage | sent per rank per step (paper 2 B / brisk 4 B) | "
          + " | ".join(f"time at {name}" for name, _ in links)
          + " | model states per rank, paper | brisk's plan (rank 0) |"
          + " offloaded: GPU / host, host link per step |")
    print("|---|---|---|---|" + "---|" * len(links) + "---|---|---|")
    for model in a.models.split(","):
        psi = None
        for n in map(int, a.ranks.split(",")):
            for stage in (0, 1, 2, 3):
                states, _, psi = brisk_plan(model, n, stage)
                planned = f"{states / 2**30:.2f} GiB ({states / psi:.2f} B/param)"
                gpu, host, _ = brisk_plan(model, n, stage, offload=True)
                link_ms = 4 * psi / (n if stage else 1) / PCIE * 1e3
                offloaded = f"{gpu / 2**30:.2f} / {host / 2**30:.2f} GiB, {link_ms:.0f} ms"
                elements = comm_elements(stage, n, psi)
                paper_bytes, brisk_bytes = 2 * elements, 4 * elements
                times = " | ".join(f"{paper_bytes / bw * 1e3:.0f} / {brisk_bytes / bw * 1e3:.0f} ms"
                                   for _, bw in links)
                states_paper = paper_bytes_per_param(stage, n) * psi
                print(f"| {model} ({psi / 1e6:.0f}M) | {n} | {stage} | "
                      f"{paper_bytes / 2**20:.0f} / {brisk_bytes / 2**20:.0f} MiB | {times} | "
                      f"{states_paper / 2**30:.2f} GiB | {planned} | {offloaded} |")


if __name__ == "__main__":
    main()
