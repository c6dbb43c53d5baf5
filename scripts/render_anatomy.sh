#!/usr/bin/env bash
# Renders a memory anatomy page (output_dir/memory.html, brisk estimate --html) to a PNG with
# headless Chromium, to check that it draws offline. Installs Debian's chromium when missing.
#   bash scripts/render_anatomy.sh PAGE.html OUT.png [WIDTHxHEIGHT]
set -euo pipefail
page=$(realpath "$1")
out=$(realpath -m "$2")
size=${3:-1100x700}
if ! command -v chromium >/dev/null 2>&1; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq chromium >/dev/null
fi
chromium --headless --no-sandbox --disable-gpu --window-size="${size/x/,}" \
  --screenshot="$out" "file://$page" >/dev/null 2>&1
test -s "$out" && echo "rendered $page -> $out"
