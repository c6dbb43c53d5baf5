#!/usr/bin/env bash
# Runs on a lent GPU machine (device tool, carrying .dev from scripts/gpu_pack.sh): the GPU tests,
# then the GPU benchmarks named as arguments (gpu_offload, gpu_bert; a GPT-2 bf16 step's kernels
# under Nsight Compute; GPT-2 with its vocabulary padded to a multiple of 8), logs under $OUT.
#   bash scripts/gpu_check.sh [tests] [cpu-suite] [offload] [bert] [anchors] [profile] [timeline]
#     [vocab] [same] [speed] [rebuild] [head] [mlm] [mlm-rows] [residual-norm] [switch] [switches]
#     [padded] [recorded]
# (tests: $TESTS, a gtest filter, narrows brisk_tests' GPU tests)
# (switch: GPT-2 with the measurement switch $SWITCH set to 0 against unset, alternated;
#  switches: every switch in $SWITCHES at once)
# (anchors: bench/gpu_anchors.py with the systems in $ANCHORS, default brisk,torch,compile,trainer,
#  and more arguments in $ANCHOR_ARGS, e.g. --batches bert:32,gpt2:32)
# (BUDGET=seconds: the modes in order, each ended when the budget is spent, the rest skipped and
#  named, so that one call within the device's per-command limit brings back what finished)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
here=$(pwd)
if [ -z "${GPU_CHECK_SET_UP:-}" ]; then
  tar -xJf .dev/pack.tar.xz -C . build-gpu && tar -xJf .dev/pack.tar.xz -C .dev lib
  # The test programs name their fixtures and programs by the development checkout's paths.
  [ "$here" = /work/main ] || { mkdir -p /work; ln -sfn "$here" /work/main; }
  cuda_libs=$(dirname $(find / -xdev \( -name 'libnccl.so.2' -o -name 'libcublasLt.so.13' -o \
    -name 'libcudart.so.13' -o -name 'libcudnn.so.9' \) 2>/dev/null | sort -u) | sort -u | tr '\n' ':')
  echo "libraries from: $cuda_libs"
  export LD_LIBRARY_PATH="$here/.dev/lib:${cuda_libs}${LD_LIBRARY_PATH:-}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  grep -m1 'model name' /proc/cpuinfo; nproc
  export GPU_CHECK_SET_UP=1
fi
if [ -n "${BUDGET:-}" ]; then
  deadline=$(($(date +%s) + BUDGET))
  for what in "${@:-tests}"; do
    left=$((deadline - $(date +%s)))
    if [ "$left" -lt 15 ]; then echo "gpu_check: $what skipped, the budget is spent"; continue; fi
    echo "gpu_check: $what ($left s left)"
    BUDGET= timeout "$left" bash "$0" "$what" || echo "gpu_check: $what ended with status $?"
  done
  exit 0
fi
# GPT-2 124M (random init), bf16, batch $BATCH (8) x 1024 on the GPU, by $BRISK_TRAIN (this build):
#   gpt2_train VOCAB STEPS [launcher...]
gpt2_train() {
  local vocab=$1 steps=$2 t=/tmp/gpt2_bench; shift 2; mkdir -p $t
  (cd bench && python3 -c "from gpu_bert import GPT2, write_config, write_tokens
write_config('$t/gpt2_$vocab', dict(GPT2, vocab_size=$vocab)); write_tokens('$t/tok.bin', 128 * 1024 + 1)")
  "$@" ${BRISK_TRAIN:-build-gpu/brisk} train --device cuda --model $t/gpt2_$vocab --seq_len 1024 \
    --num_train_epochs 1 --logging_steps 1000000 --save_strategy no --output_dir $t/out \
    --disable_tqdm true --dataset $t/tok.bin --per_device_train_batch_size ${BATCH:-8} --bf16 true \
    --max_steps $steps >/dev/null 2>&1
  grep -o '"train_samples_per_second": *[0-9.]*' $t/out/train_results.json
}
for what in "${@:-tests}"; do
  case $what in
    tests)
      build-gpu/tests/brisk_tests \
        --gtest_filter="${TESTS:-*cuda*:*Cuda*:*Gpu*:*GPU*:*Offload*:*Nccl*:FusedAttention*}" \
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
    anchors) (cd bench && BRISK_BIN=$here/build-gpu/brisk PYTHONUNBUFFERED=1 python3 gpu_anchors.py \
        --systems "${ANCHORS:-brisk,torch,compile,trainer}" --json "$OUT/anchors.json" \
        ${ANCHOR_ARGS:-}) 2>&1 |
        tee "$OUT/anchors.log" ;;
    profile)  # $NCU_COUNT kernels (2500, about 1.4 steps at batch 8) after $NCU_SKIP, by name
      # (GPT-2 with $VOCAB tokens, 50257 by default)
      gpt2_train ${VOCAB:-50257} 6 timeout ${NCU_TIMEOUT:-400} ncu --metrics gpu__time_duration.sum --csv \
        --launch-skip ${NCU_SKIP:-2500} --launch-count ${NCU_COUNT:-2500} \
        --log-file "$OUT/ncu.csv" >/dev/null
      python3 bench/ncu_summary.py "$OUT/ncu.csv" | tee "$OUT/profile.log" ;;
    timeline)  # the kernels of 8 GPT-2 steps under Nsight Systems, summed by name
      nsys=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys \
        2>/dev/null | head -1)
      [ -n "$nsys" ] || { echo "no nsys on this machine"; continue; }
      gpt2_train 50257 8 timeout 300 "$nsys" profile -t cuda -o /tmp/timeline -f true >/dev/null
      "$nsys" stats --report cuda_gpu_kern_sum --format csv /tmp/timeline.nsys-rep \
        >"$OUT/kern_sum.csv" 2>/dev/null
      python3 bench/ncu_summary.py "$OUT/kern_sum.csv" | tee "$OUT/timeline.log" ;;
    same)  # this build against $BRISK_BASE_BIN: GPT-2's loss over 20 steps (with dropout); two
      # runs of one build differed in the 7th digit on an H200, so compare against that spread
      for bin in "$BRISK_BASE_BIN" build-gpu/brisk; do
        BRISK_TRAIN=$bin gpt2_train 50257 20 >/dev/null
        echo "$bin: $(grep -o '"train_loss": *[0-9.e+-]*' /tmp/gpt2_bench/out/train_results.json)"
      done | tee "$OUT/same.log" ;;
    rebuild)  # the MLP activation's output kept (BRISK_RECOMPUTE_ACTIVATION=0) against rebuilt in
      # backward (this build's default), alternated: GPT-2's samples/s over $STEPS (16) steps
      for keep in 0 1 0 1; do
        if [ $keep = 0 ]; then
          echo "kept: $(BRISK_RECOMPUTE_ACTIVATION=0 gpt2_train 50257 ${STEPS:-16})"
        else echo "rebuilt: $(gpt2_train 50257 ${STEPS:-16})"; fi
      done | tee "$OUT/rebuild.log" ;;
    speed)  # this build against $BRISK_BASE_BIN, alternated: GPT-2's samples/s over $STEPS (16)
      for bin in "$BRISK_BASE_BIN" build-gpu/brisk "$BRISK_BASE_BIN" build-gpu/brisk; do
        echo "$bin: $(BRISK_TRAIN=$bin gpt2_train 50257 ${STEPS:-16})"
      done | tee "$OUT/speed.log" ;;
    mlm)  # BERT-base as a masked LM (a head with a bias), bf16, batch $BATCH (32) x 128, $STEPS
      # (40) steps, its head padded (this build's default) against unpadded (BRISK_PAD_HEAD=0),
      # alternated
      t=/tmp/mlm_bench; mkdir -p $t
      for i in $(seq 2000); do cat tests/fixtures/smollm2_kjv/psalm23.txt; done >$t/train.txt
      for pad in 0 1 0 1; do
        BRISK_PAD_HEAD=$pad build-gpu/brisk train --device cuda --model bert-base-uncased --mlm \
          --tokenizer_name tests/fixtures/tokenizer/wordpiece --train_file $t/train.txt \
          --max_seq_length 128 --per_device_train_batch_size ${BATCH:-32} --bf16 true \
          --max_steps ${STEPS:-40} --logging_steps 1000000 --save_strategy no --output_dir $t/out \
          --disable_tqdm true >"$OUT/mlm_pad$pad.log" 2>&1
        echo "padded=$pad: $(grep -o '"train_samples_per_second": *[0-9.]*' $t/out/train_results.json)"
      done | tee "$OUT/mlm.log" ;;
    padded)  # right-padded fine-tuning batches: bert-large classification, bf16, batch $BATCH (32)
      # x 512 (--pad_to_max_length), rows of about 40 to 500 tokens, $STEPS (40) steps; cuDNN's
      # padding mask (this build's default) against the mask alone, as a bias
      # (BRISK_KEY_LENGTHS=0), alternated
      t=/tmp/padded_bench; mkdir -p $t
      python3 - $t/train.csv <<'PY'
import random, sys
words = open("tests/fixtures/smollm2_kjv/psalm23.txt").read().replace('"', '').split()
random.seed(0)
with open(sys.argv[1], "w") as f:
    f.write("sentence,label\n")
    for i in range(4000):
        n = random.randint(30, 400)
        f.write('"%s",%d\n' % (" ".join(random.choice(words) for _ in range(n)), i % 2))
PY
      for counts in 0 1 0 1; do
        BRISK_KEY_LENGTHS=$counts build-gpu/brisk train --device cuda \
          --model bert-large-uncased --tokenizer_name tests/fixtures/tokenizer/wordpiece \
          --train_file $t/train.csv --max_seq_length 512 --pad_to_max_length true \
          --per_device_train_batch_size ${BATCH:-32} --bf16 true --max_steps ${STEPS:-40} \
          --logging_steps 1000000 --save_strategy no --output_dir $t/out --disable_tqdm true \
          >"$OUT/padded_counts$counts.log" 2>&1
        echo "key counts=$counts: $(grep -o '"train_samples_per_second": *[0-9.]*' \
          $t/out/train_results.json)"
      done | tee "$OUT/padded.log" ;;
    mlm-rows)  # bench/mlm_rows.sh: a masked LM's decoder over the labelled rows against every row
      BRISK_BIN=build-gpu/brisk BATCH=${BATCH:-32} STEPS=${STEPS:-300} bash bench/mlm_rows.sh cuda \
        2>&1 | tee "$OUT/mlm_rows.log" ;;
    residual-norm)  # the residual add before a norm fused (this build's default) against two
      # passes (BRISK_FUSED_RESIDUAL_NORM=0): the op alone, then GPT-2's samples/s over $STEPS (16)
      build-gpu/bench_residual_norm cuda 2>&1 | tee "$OUT/residual_norm.log"
      for fused in 0 1 0 1; do
        echo "fused=$fused: $(BRISK_FUSED_RESIDUAL_NORM=$fused gpt2_train 50257 ${STEPS:-16})"
      done | tee -a "$OUT/residual_norm.log" ;;
    recorded)  # recorded micro-batches (CUDA graphs: BRISK_RECORDED_STEPS=1) against the usual
      # launches: GPT-2's samples/s at batch $BATCH (8) over $STEPS (16), alternated
      for on in 1 0 1 0; do
        echo "recorded=$on: $(BRISK_RECORDED_STEPS=$on gpt2_train 50257 ${STEPS:-16})"
      done | tee "$OUT/recorded.log" ;;
    switch)  # GPT-2's samples/s over $STEPS (16) with $SWITCH=0 (a path turned off) and without
      for off in 1 0 1 0; do
        if [ $off = 1 ]; then echo "$SWITCH=0: $(export "$SWITCH=0"; gpt2_train 50257 ${STEPS:-16})"
        else echo "default: $(gpt2_train 50257 ${STEPS:-16})"; fi
      done | tee "$OUT/switch_$SWITCH.log" ;;
    switches)  # GPT-2's samples/s over $STEPS (16) with every switch in $SWITCHES set to 0 at once
      # (default: the paths of 2026-11-28 and -29, written without a GPU) against none, alternated
      off=${SWITCHES:-BRISK_FUSED_RESIDUAL_NORM BRISK_UNMASKED_ATTENTION BRISK_BF16_ACTIVATION_GRADIENT BRISK_ATTENTION_BF16_IO BRISK_BF16_HEAD_GRAD}
      for all in 1 0 1 0; do
        if [ $all = 1 ]; then
          echo "all off: $(for v in $off; do export "$v=0"; done; gpt2_train 50257 ${STEPS:-16})"
        else echo "default: $(gpt2_train 50257 ${STEPS:-16})"; fi
      done | tee "$OUT/switches.log" ;;
    head)  # the LM head's products alone, through PyTorch's cuBLASLt, by vocabulary and stride
      python3 bench/gpu_head_products.py 2>&1 | grep -v Warning | tee "$OUT/head.log" ;;
    vocab)  # the LM head's row stride: 50257 against 50304 (a multiple of 8), alternated
      for v in 50257 50304 50257 50304; do echo "vocab $v: $(gpt2_train $v 16)"; done |
        tee "$OUT/vocab.log" ;;
  esac
done
