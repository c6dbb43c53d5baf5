#!/usr/bin/env bash
# Builds brisk for a lent GPU machine (portable x86-64-v3 code, sm_90, no oneDNN) into build-gpu/
# and packs its programs with the shared libraries that machine lacks (OpenBLAS, Open MPI, ...)
# into .dev/pack.tar.xz, small enough to carry with the device tool (64 MiB). On the GPU machine,
# scripts/gpu_check.sh unpacks it, runs the GPU tests and then the GPU benchmarks.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DBRISK_ARCH_FLAGS=-march=x86-64-v3 \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DBRISK_WITH_DNNL=OFF >/dev/null
ninja -C build-gpu brisk brisk_tests brisk_dist_tests bench_residual_norm
mkdir -p .dev/lib
mkdir -p .git/info; grep -qx '/.dev/' .git/info/exclude 2>/dev/null || echo '/.dev/' >>.git/info/exclude
# Everything the programs load apart from the C runtime, the C++ runtime and CUDA's own libraries
# (the GPU machine has those).
ldd build-gpu/brisk build-gpu/tests/brisk_tests build-gpu/tests/brisk_dist_tests |
  awk '/=>/ {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libmvec|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libnccl|libcudart)\.so' |
  while read -r lib; do cp -L "$lib" .dev/lib/; done
tar -cJf .dev/pack.tar.xz build-gpu/brisk build-gpu/tests/brisk_tests \
  build-gpu/tests/brisk_dist_tests build-gpu/bench_residual_norm -C .dev lib
ls -l .dev/pack.tar.xz
