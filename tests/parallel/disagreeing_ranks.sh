#!/usr/bin/env bash
# disagreeing_ranks.sh BRISK WORK_DIR LAUNCH_ENV: ranks started with different options or model
# configs end at once, each case with one error line naming what differs, under mpirun (one
# command per rank) and under torchrun's variables through Gloo (tests/parallel/launch_env.sh,
# the rank's own options chosen by $RANK). Without the start-up check they wait for each other
# until --ddp_timeout, or train apart.
set -u
brisk=$1
work=$2
launch_env=$3
rm -rf "$work"
mkdir -p "$work"
# Two GPT-2 configs alike but for n_inner.
for inner in 64 96; do
  printf '{"model_type": "gpt2", "vocab_size": 128, "n_positions": 64, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_inner": %s}\n' \
    "$inner" >"$work/inner$inner.json"
done
job="train --max_steps 2 --seq_len 16 --dataset_size 16 --per_device_train_batch_size 2 \
  --disable_tqdm --save_strategy no --ddp_timeout 60"
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
status=0
# expect NAME PATTERN COMMAND...: the command fails within 30 s with exactly one error line, and
# that line matches PATTERN.
expect() {
  local name=$1 pattern=$2
  shift 2
  local out rc
  out=$(timeout 30 "$@" 2>&1)
  rc=$?
  local errors
  errors=$(echo "$out" | grep -c "^brisk: error")
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$errors" -ne 1 ] ||
    ! echo "$out" | grep -Eq "$pattern"; then
    echo "disagreeing_ranks.sh: $name: exit $rc, $errors error lines, expected one matching: $pattern"
    echo "$out" | tail -n 8
    status=1
  else
    echo "disagreeing_ranks.sh: $name: $(echo "$out" | grep "^brisk: error")"
  fi
}
if command -v mpirun >/dev/null 2>&1; then
  expect "mpirun, --tp_size" \
    "the ranks disagree on --tp_size: 2 on rank 0, 1 on rank 1" \
    mpirun -np 1 "$brisk" $job --model "$work/inner64.json" --tp_size 2 --output_dir "$work/a" : \
    -np 1 "$brisk" $job --model "$work/inner64.json" --tp_size 1 --output_dir "$work/a"
  expect "mpirun, n_inner" \
    "the ranks disagree on .*'s config intermediate_size: 64 on rank 0, 96 on rank 1" \
    mpirun -np 1 "$brisk" $job --model "$work/inner64.json" --output_dir "$work/b" : \
    -np 1 "$brisk" $job --model "$work/inner96.json" --output_dir "$work/b"
fi
expect "torchrun's variables, --pp_size" \
  "the ranks disagree on --pp_size: 1 on rank 0, 2 on rank 1" \
  bash "$launch_env" 2 bash -c "exec $brisk $job --model $work/inner64.json \
    --pp_size \$((RANK + 1)) --output_dir $work/c"
exit "$status"
