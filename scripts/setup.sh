#!/usr/bin/env bash
# Installs the Debian packages brisk needs to build, test and fetch its example data
# (scripts/get_data.sh), when any is missing.
# (The CUDA toolkit is optional and never installed here.)
set -euo pipefail
packages=(build-essential cmake ninja-build pkg-config libopenblas-openmp-dev nlohmann-json3-dev
          libcli11-dev libgtest-dev libdnnl-dev libpcre2-dev libutf8proc-dev libsentencepiece-dev
          libxxhash-dev libopenmpi-dev openmpi-bin libgloo-dev python3 python3-pip python3-venv
          python3-dev unzip bzip2)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The cudnn-frontend headers (cuDNN's graph API, header-only; the CUDA backend's fused attention)
# into third_party/cudnn_frontend, pinned, where a CUDA toolkit is present. Without them the CUDA
# backend builds with its float32 attention alone.
frontend=third_party/cudnn_frontend
cd "$(dirname "$0")/.."
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  if [ ! -f "$frontend/include/cudnn_frontend.h" ]; then
    tmp=$(mktemp -d)
    if python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
         --implementation cp --platform manylinux_2_28_x86_64 -d "$tmp" \
         nvidia-cudnn-frontend==1.32.0 >/dev/null 2>&1; then
      mkdir -p "$frontend"
      (cd "$frontend" && unzip -q -o "$tmp"/nvidia_cudnn_frontend-1.32.0-*.whl 'include/*' \
         'nvidia_cudnn_frontend-1.32.0.dist-info/licenses/*')
    else
      echo "note: the cudnn-frontend headers could not be fetched; CUDA attention stays float32"
    fi
    rm -rf "$tmp"
  fi
fi
