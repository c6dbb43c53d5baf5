#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan, CPU only) into build-fuzz/ and runs each
# for the given seconds from its seed corpus in fuzz/corpus/<target>/ (new inputs it finds go to
# build-fuzz/corpus/<target>/; crashes to build-fuzz/crash-*).
#   bash scripts/fuzz.sh [seconds per target, default 30] [target ...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(safetensors config options token_file trainer_state text_table tokenizer token_cache weight_index launch deepspeed parallelism_config moe_config tokenizer_normalizer tokenizer_pretokenizer charsmap adapter_config bnb_weights)
scripts/setup.sh
missing=()
for p in clang libclang-rt-dev libomp-dev; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
cov="-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer"
CC=clang CXX=clang++ cmake -S . -B build-fuzz "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DBRISK_WITH_CUDA=OFF -DBRISK_WITH_DNNL=OFF -DBRISK_BUILD_TESTS=OFF -DBRISK_BUILD_FUZZERS=ON \
  -DCMAKE_CXX_FLAGS="$cov" >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target $(printf 'fuzz_%s ' "${targets[@]}")
status=0
for t in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus/$t"
  echo "== fuzz_$t for ${seconds}s"
  (cd build-fuzz && ASAN_OPTIONS=detect_leaks=0 ./fuzz_$t -max_total_time="$seconds" \
     -max_len=65536 -rss_limit_mb=4096 -timeout=10 "corpus/$t" "../fuzz/corpus/$t" 2>&1 |
     grep -E "^#[0-9]+ +DONE|ERROR|SUMMARY|Done [0-9]+ runs" || true)
  ls build-fuzz/crash-* build-fuzz/timeout-* build-fuzz/oom-* >/dev/null 2>&1 && status=1
done
exit $status
