#!/usr/bin/env bash
# BERT-base as a masked LM (random initialization, the KJV psalm repeated as its text): a
# training step whose decoder takes the labelled rows alone (brisk's default) against one over
# every row (BRISK_LABELLED_ROWS_ONLY=0), alternated, twice each; samples/s and the training loss.
#   bench/mlm_rows.sh [cpu|cuda]   (BRISK_BIN, BATCH 8, SEQ 128, STEPS 10, PRECISION bf16|fp32)
set -euo pipefail
cd "$(dirname "$0")/.."
device=${1:-cpu}
bin=${BRISK_BIN:-build/brisk}
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
for _ in $(seq 300); do cat tests/fixtures/smollm2_kjv/psalm23.txt; done >"$t/train.txt"
precision=()
[ "${PRECISION:-bf16}" = bf16 ] && precision=(--bf16 true)
echo "device $device, batch ${BATCH:-8} x ${SEQ:-128}, ${STEPS:-10} steps, ${PRECISION:-bf16}"
grep -m1 'model name' /proc/cpuinfo || true
printf '%-14s %12s %12s\n' decoder samples/s train_loss
for only in 0 1 0 1; do
  BRISK_LABELLED_ROWS_ONLY=$only "$bin" train --device "$device" --model bert-base-uncased --mlm \
    --tokenizer_name tests/fixtures/tokenizer/wordpiece --train_file "$t/train.txt" \
    --max_seq_length "${SEQ:-128}" --per_device_train_batch_size "${BATCH:-8}" "${precision[@]}" \
    --max_steps "${STEPS:-10}" --logging_steps 1000000 --save_strategy no \
    --output_dir "$t/out" --disable_tqdm true >"$t/log" 2>&1 || { cat "$t/log"; exit 1; }
  read -r speed loss < <(python3 -c "import json; r = json.load(open('$t/out/train_results.json'))
print(round(r['train_samples_per_second'], 2), round(r['train_loss'], 6))")
  printf '%-14s %12s %12s\n' "$([ "$only" = 1 ] && echo labelled || echo every-row)" "$speed" "$loss"
done
