#!/usr/bin/env bash
# The include rule of docs/architecture.md as a test: each folder of src/ includes only itself and
# the folders src/layers.txt allows it (the table the build's per-folder libraries link by), and
# third-party headers only where that page says. A new include across folders fails here until
# the table says so.
#   bash tests/check_layers.sh [repository root]
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
declare -A allowed=()
while IFS=: read -r folder below; do
  allowed[$folder]=$below
done < <(grep -E '^[a-z_]+:' src/layers.txt)
failures=0
fail() {
  echo "check_layers: $*" >&2
  failures=$((failures + 1))
}
for folder in src/*/; do
  folder=${folder#src/}
  folder=${folder%/}
  [ -n "${allowed[$folder]+set}" ] || fail "src/$folder is not in src/layers.txt (docs/architecture.md)"
done
while IFS=: read -r file _ line; do
  folder=${file#src/}
  folder=${folder%%/*}
  target=$(sed -E 's/^#include "([a-z_0-9]+)\/.*/\1/' <<<"$line")
  [ "$target" = "$folder" ] && continue
  case " ${allowed[$folder]:-} " in
    *" $target "*) ;;
    *) fail "$file includes $target/, which $folder/ may not (src/layers.txt): $line" ;;
  esac
done < <(grep -rnE '^#include "[a-z_0-9]+/' src)
# Third-party headers at the edges: header pattern, then the files that may include it.
check_edge() {
  local pattern=$1 where=$2
  while IFS=: read -r file _; do
    [[ $file =~ $where ]] || fail "$file includes $pattern, kept to $where"
  done < <(grep -rlnE "^#include <$pattern" src | sed 's/$/:/')
}
check_edge 'mpi\.h' '^src/parallel/mpi\.cpp$'
check_edge 'gloo/' '^src/parallel/gloo\.cpp$'
check_edge 'nccl\.h' '^src/parallel/nccl\.cpp$'
check_edge '(cuda_runtime|cuda_bf16|cuda_fp16|cublasLt|cudnn)' '^src/(backend/cuda/|parallel/nccl\.cpp$)'
check_edge '(dnnl|oneapi/dnnl|cblas)' '^src/backend/cpu/'
check_edge 'nanobind/' '^src/python/'
if [ "$failures" -gt 0 ]; then
  echo "check_layers: $failures problem(s)" >&2
  exit 1
fi
echo "check_layers: every include follows the map"
