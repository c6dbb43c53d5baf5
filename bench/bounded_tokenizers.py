#!/usr/bin/env python3
"""How brisk's tokenizers grow on one long input (issue 50): a single line of 10 KB, 100 KB and
1 MB through `brisk tokenize`, for each input class that used to cost its length squared or
without end. Prints the seconds per size (the whole command, loading included) and the growth
from 100 KB to 1 MB (10 is linear), so near-linear growth is visible at a glance.

Rows: one long word through GPT-2-style byte-level BPE (the merges); a long word through
WordPiece with max_input_chars_per_word 1e12; a long text through Llama-2-style byte-fallback
BPE (no pre-tokenizer: the whole line is merged), Unigram and a SentencePiece BPE model; a
Replace normalizer chain doubling the text 40 times and a catastrophic Split regex, both refused
(the seconds until the refusal). Tokenizer files come from tests/fixtures/tokenizer or are written
here. Standard library only.

Run (after scripts/build.sh; BRISK_BIN=... times another build, --skip leaves rows out, e.g.
"Replace" for a build without the normalizer bound, whose chain would fill the memory):
    python3 bench/bounded_tokenizers.py [--sizes 10000,100000,1000000] [--timeout 600]
                                        [--skip Replace,WordPiece]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BRISK = os.environ.get("BRISK_BIN", os.path.join(ROOT, "build", "brisk"))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "tokenizer")


def cpu_name():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def write_json(folder, name, obj):
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        json.dump(obj, f)
    return path


def wordpiece(folder):
    vocab = {"[UNK]": 0, "a": 1, "##a": 2, "##aa": 3, "##aaa": 4}
    return write_json(folder, "wordpiece.json", {"model": {
        "type": "WordPiece", "vocab": vocab, "unk_token": "[UNK]",
        "max_input_chars_per_word": 10**12}})


def doubling(folder):
    step = {"type": "Replace", "pattern": {"String": "a"}, "content": "aa"}
    return write_json(folder, "doubling.json", {
        "model": {"type": "Unigram", "vocab": [["a", -1.0]], "unk_id": 0},
        "normalizer": {"type": "Sequence", "normalizers": [step] * 40}})


def catastrophic(folder):
    vocab = {chr(c): c - ord("a") for c in range(ord("a"), ord("z") + 1)}
    split = {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated",
             "invert": False}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}
    return write_json(folder, "regex.json", {
        "model": {"type": "BPE", "vocab": vocab, "merges": []},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split, byte_level]}})


def letters(n, alphabet="etaoinshrdlu"):
    rng = random.Random(0)
    return "".join(rng.choice(alphabet) for _ in range(n))


def words(n):
    rng = random.Random(0)
    out, size = [], 0
    while size < n:
        out.append("".join(rng.choice("etaoinshrdlu") for _ in range(rng.randint(1, 9))) + " ")
        size += len(out[-1])
    return "".join(out)[:n]


def run(tokenizer, text, folder, timeout):
    path = os.path.join(folder, "input.txt")
    with open(path, "w") as f:
        f.write(text + "\n")
    start = time.perf_counter()
    try:
        r = subprocess.run([BRISK, "tokenize", "--tokenizer", tokenizer, "--input", path,
                            "--count_only"], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"over {timeout} s"
    seconds = time.perf_counter() - start
    outcome = "ok" if r.returncode == 0 else f"exit {r.returncode}"
    if r.returncode < 0:
        sys.exit(f"{tokenizer}: killed by signal {-r.returncode}")
    return seconds, outcome


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per command")
    parser.add_argument("--skip", default="", help="rows whose name holds one of these words")
    args = parser.parse_args()
    skip = [w for w in args.skip.split(",") if w]
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        rows = [
            ("GPT-2 byte-level BPE, one word", os.path.join(FIXTURES, "bpe"), letters),
            ("WordPiece, one word, max chars 1e12", wordpiece(folder), lambda n: "a" * n),
            ("byte-fallback BPE (Llama-2), words", os.path.join(FIXTURES, "bpe_byte_fallback"),
             words),
            ("Unigram, words", os.path.join(FIXTURES, "unigram"), words),
            ("SentencePiece BPE model, words", os.path.join(FIXTURES, "sentencepiece_bpe"), words),
            ("Replace chain doubling 40x", doubling(folder), lambda n: "a" * n),
            ("Split regex (a+)+$", catastrophic(folder), lambda n: "a" * (n - 1) + "!"),
        ]
        print(f"brisk tokenize on one line, seconds (whole command); CPU: {cpu_name()}, "
              f"{os.cpu_count()} threads")
        header = ["input"] + [f"{s // 1000} KB" for s in sizes] + [
            f"{sizes[-1] // 1000} KB / {sizes[-2] // 1000} KB", "result"]
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for name, tokenizer, make in rows:
            if any(w in name for w in skip):
                continue
            results = []
            for n in sizes:  # once a size runs out of time, the larger ones would too
                late = results and results[-1][0] is None
                results.append((None, results[-1][1]) if late else
                               run(tokenizer, make(n), folder, args.timeout))
            times = [t for t, _ in results]
            ratio = f"{times[-1] / times[-2]:.1f}" if None not in times[-2:] else "-"
            cells = [name] + [f"{t:.3f}" if t is not None else "-" for t in times] + [
                ratio, results[-1][1]]
            print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
