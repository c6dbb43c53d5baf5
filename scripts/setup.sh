#!/usr/bin/env bash
# Installs the Debian packages brisk needs to build, test and fetch its example data
# (scripts/get_data.sh), when any is missing.
# (The CUDA toolkit is optional and never installed here.)
set -euo pipefail
packages=(build-essential cmake ninja-build pkg-config libopenblas-openmp-dev nlohmann-json3-dev
          libcli11-dev libgtest-dev libdnnl-dev libpcre2-dev libutf8proc-dev libsentencepiece-dev
          libxxhash-dev libopenmpi-dev openmpi-bin libgloo-dev python3 python3-pip unzip bzip2)
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
