#!/usr/bin/env python3
"""Tokenizer throughput: brisk's tokenizers against the `tokenizers` library's batch encoding,
same thread count, on the KJV text (data/ from scripts/get_data.sh): the real BERT WordPiece
(all-MiniLM-L6-v2's tokenizer.json) and GPT-2's byte-level BPE (vocab.json + merges.txt). Also
checks that both produce the same ids on every line.

    .venv/bin/python bench/tokenizer_speed.py [--threads N] [--repeat 3]
"""
import argparse
import json
import os
import subprocess
import sys
import time

from common import cpu_name

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BRISK = os.environ.get("BRISK_BIN", os.path.join(ROOT, "build", "brisk"))
KJV = os.path.join(ROOT, "data", "kjv", "kjv.txt")
TOKENIZERS = {"wordpiece (MiniLM)": os.path.join(ROOT, "data", "all-MiniLM-L6-v2"),
              "byte-level BPE (GPT-2)": os.path.join(ROOT, "data", "gpt2-tokenizer")}


def hf_tokenizer(path):
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    if os.path.exists(os.path.join(path, "tokenizer.json")):
        t = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
        t.no_padding()
        t.no_truncation()
        return t
    t = Tokenizer(models.BPE.from_file(os.path.join(path, "vocab.json"),
                                       os.path.join(path, "merges.txt")))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    return t


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    if not os.path.exists(KJV):
        sys.exit("data/kjv/kjv.txt is missing: run scripts/get_data.sh")
    os.environ["RAYON_NUM_THREADS"] = str(a.threads)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    with open(KJV, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    rows = []
    for name, path in TOKENIZERS.items():
        t = hf_tokenizer(path)
        best_hf = float("inf")
        for _ in range(a.repeat):
            start = time.perf_counter()
            enc = t.encode_batch(lines)
            best_hf = min(best_hf, time.perf_counter() - start)
        tokens = sum(len(e.ids) for e in enc)
        best_brisk = float("inf")
        for _ in range(a.repeat):
            out = subprocess.run([BRISK, "tokenize", "--tokenizer", path, "--input", KJV,
                                  "--count_only"], check=True, capture_output=True, text=True,
                                 env=env).stdout
            r = json.loads(out.strip().splitlines()[-1])
            best_brisk = min(best_brisk, r["seconds"])
        assert r["tokens"] == tokens, (name, r["tokens"], tokens)
        # Every line's ids, once.
        ours = subprocess.run([BRISK, "tokenize", "--tokenizer", path, "--input", KJV],
                              check=True, capture_output=True, text=True, env=env).stdout
        ours = [json.loads(l) for l in ours.splitlines()]
        same = sum(o == e.ids for o, e in zip(ours, enc))
        rows.append((name, tokens, tokens / best_brisk, tokens / best_hf, same, len(lines)))
    cpu = cpu_name()
    print(f"KJV ({len(lines)} lines), {a.threads} threads, best of {a.repeat}; CPU: {cpu}")
    print("| tokenizer | tokens | brisk tokens/s | tokenizers tokens/s | ratio | identical lines |")
    print("|---|---|---|---|---|---|")
    for name, tokens, ours, theirs, same, n in rows:
        print(f"| {name} | {tokens} | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.2f}x | "
              f"{same}/{n} |")


if __name__ == "__main__":
    main()
