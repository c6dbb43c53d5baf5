#!/usr/bin/env bash
# Builds brisk with AddressSanitizer and UndefinedBehaviorSanitizer (CPU only) into
# build-sanitize/ and runs the whole test suite under them; any report fails the run.
#   bash scripts/sanitize.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S . -B build-sanitize "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DBRISK_WITH_CUDA=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build build-sanitize -j "$(nproc)"
cd build-sanitize
# detect_leaks: the OpenMP and OpenBLAS thread pools keep their allocations until exit.
# quarantine_size_mb: freed memory held back by ASan counts in the resident size, which the
# memory tests compare with the plan; a small quarantine keeps it close to a normal run's.
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:quarantine_size_mb=16 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure
