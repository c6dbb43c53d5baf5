#!/usr/bin/env bash
# Installs what is missing, builds, fetches the real data (scripts/get_data.sh) and runs the main
# job: the pretrained all-MiniLM-L6-v2 fine-tuned on the Rotten Tomatoes review snippets as
# run_glue would (one epoch), then evaluated on the held-out 10%, printing the eval metrics and
# the memory anatomy. Extra arguments go to `brisk train` (e.g. --max_steps 100 for a shorter run).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh brisk
scripts/get_data.sh
exec build/brisk train --model data/all-MiniLM-L6-v2 \
  --train_file data/rotten_tomatoes/train.csv --validation_file data/rotten_tomatoes/validation.csv \
  --max_seq_length 64 --per_device_train_batch_size 32 --learning_rate 5e-5 --num_train_epochs 1 \
  --do_eval --logging_steps 50 --save_strategy no --output_dir output/minilm-rotten-tomatoes "$@"
