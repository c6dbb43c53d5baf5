#!/usr/bin/env python3
"""PyTorch's bf16 CPU matrix products (its bundled oneDNN) at the shapes `build/bench_matmul
--bf16-shapes` times brisk's oneDNN on: GFLOP/s of a plain A and of a transposed A, float32
accumulation, bf16 result (torch's), the best of 20 calls after a warm-up, on as many threads as
OMP_NUM_THREADS says (default: all). Shows whether a newer oneDNN multiplies faster.

    OMP_NUM_THREADS=2 .venv/bin/python bench/torch_matmul.py
"""
import os
import time

import torch

SHAPES = [(3072, 1024, 576), (1536, 1024, 576), (960, 1024, 576), (576, 1024, 576),
          (576, 1024, 1536), (1024, 576, 3072), (1024, 3072, 576), (1024, 576, 1536)]


def rate(a, b):
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(20):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    m, k = a.shape
    return 2 * m * k * b.shape[1] / best * 1e-9


def main():
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count())))
    onednn = torch.__config__.show().split("MKL-DNN v")[1].split()[0]
    print(f"torch {torch.__version__}, oneDNN {onednn}, {torch.get_num_threads()} threads")
    print("| M x K x N | A plain | A transposed |")
    print("|---|---|---|")
    for m, k, n in SHAPES:
        # Constant operands, as bench_matmul fills its own (bytes 0x3f and 0x3c).
        a = torch.full((m, k), 0.746, dtype=torch.bfloat16)
        at = torch.full((k, m), 0.746, dtype=torch.bfloat16).t()
        b = torch.full((k, n), 0.0115, dtype=torch.bfloat16)
        print(f"| {m} x {k} x {n} | {rate(a, b):.0f} | {rate(at, b):.0f} |")


if __name__ == "__main__":
    main()
