#!/usr/bin/env bash
# torchrun.sh N COMMAND...: starts N copies of COMMAND with torchrun itself on this host
# (`torchrun --no-python --nproc_per_node N`), as a user of the Hugging Face guides does. Exits 77
# (ctest's skip) when torchrun is not installed.
set -u
n=$1
shift
if command -v torchrun >/dev/null 2>&1; then
  launcher=(torchrun)
elif python3 -c 'import torch.distributed.run' >/dev/null 2>&1; then
  launcher=(python3 -m torch.distributed.run)
else
  echo "torchrun is not installed (neither torchrun on PATH nor python3's torch): skipped"
  exit 77
fi
exec "${launcher[@]}" --standalone --no-python --nproc_per_node "$n" "$@"
