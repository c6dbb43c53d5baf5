#!/usr/bin/env bash
# Runs on a lent GPU machine (device tool, carrying .dev from scripts/gpu_pack.sh): the GPU tests,
# then the GPU benchmarks named as arguments (gpu_offload, gpu_bert), logs under $OUT.
#   bash scripts/gpu_check.sh [tests] [cpu-suite] [offload] [bert]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
tar -xJf .dev/pack.tar.xz -C . build-gpu && tar -xJf .dev/pack.tar.xz -C .dev lib
# The test programs name their fixtures and programs by the development checkout's paths.
here=$(pwd); [ "$here" = /work/main ] || { mkdir -p /work; ln -sfn "$here" /work/main; }
cuda_libs=$(dirname "$(find / -xdev \( -name 'libnccl.so.2' -o -name 'libcublasLt.so.13' -o \
  -name 'libcudart.so.13' \) 2>/dev/null | sort -u)" | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="$here/.dev/lib:${cuda_libs}${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
grep -m1 'model name' /proc/cpuinfo; nproc
for what in "${@:-tests}"; do
  case $what in
    tests)
      build-gpu/tests/brisk_tests --gtest_filter='*cuda*:*Cuda*:*Gpu*:*GPU*:*Offload*:*Nccl*' \
        2>&1 | tee "$OUT/tests.log" | grep -E '^\[  (FAILED|PASSED) |^\[==|Failure' | head -60
      build-gpu/tests/brisk_dist_tests --gtest_filter='*Nccl*:*Gpu*:*Offload*' 2>&1 |
        tee "$OUT/dist_tests.log" | grep -E '^\[  (FAILED|PASSED|SKIPPED) |^\[==|Failure' | head -30 ;;
    cpu-suite)  # the CPU tests on this machine's many cores (thread-count dependence)
      timeout 240 build-gpu/tests/brisk_tests --gtest_filter='-*cuda*:*Cuda*:*Gpu*:*GPU*' 2>&1 |
        tee "$OUT/cpu_suite.log" | grep -E '^\[  FAILED |^\[==|Failure' | head -40 ;;
    offload) (cd bench && BRISK_BIN=$here/build-gpu/brisk PYTHONUNBUFFERED=1 python3 gpu_offload.py) \
        2>&1 | tee "$OUT/offload.log" ;;
    bert) (cd bench && BRISK_BIN=$here/build-gpu/brisk PYTHONUNBUFFERED=1 python3 gpu_bert.py \
        --samples 128 --rows quick) 2>&1 | tee "$OUT/bert.log" ;;
  esac
done
