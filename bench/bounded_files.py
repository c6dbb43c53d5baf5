#!/usr/bin/env python3
"""How reading hostile-shaped inputs grows with their size: a JSON Lines training file of many
distinct keys (rows of ten keys drawn from up to 4000 names, the rest of the 4096-column bound
left free) and a model.safetensors whose header holds many entries (bert_tiny's weights plus
one-element tensors). Each at three sizes, 10x apart, through the brisk CLI: `train` one step on
the JSON Lines file (parsed, tokenized, one step of bert-tiny) and `forward-backward` on the
weights (header parsed, validated, weights loaded), each the least CPU time (user + system, one
OpenMP thread) of 3 runs. Prints seconds per size, after size 0 (a two-row file, bert_tiny's own
weights: what every run costs), and the ratio to the size before: at most 10 is linear (the
fixed cost included), 100 would be quadratic. Python's standard library only.

Run (after scripts/build.sh):
    python3 bench/bounded_files.py [--sizes 1000,10000,100000]
"""
import argparse
import json
import os
import resource
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from common import cpu_name  # noqa: E402

BRISK = os.environ.get("BRISK_BIN", os.path.join(ROOT, "build", "brisk"))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
BERT = os.path.join(FIXTURES, "bert_tiny")
WORDPIECE = os.path.join(FIXTURES, "tokenizer", "wordpiece")
KEY_POOL = 4000  # distinct extra keys at most (brisk reads at most 4096 columns)


def write_jsonl(path, entries):
    """entries key-value pairs in rows of ten: sentence, label and eight keys from the pool."""
    with open(path, "w") as f:
        for row in range(max(2, entries // 10)):
            rec = {"sentence": f"good film {row}", "label": row % 2}
            for j in range(8):
                rec[f"k{(row * 8 + j) % KEY_POOL}"] = j
            f.write(json.dumps(rec) + "\n")


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def write_safetensors(path, entries):
    """bert_tiny's weights and `entries` one-element float32 tensors after them."""
    header, body = read_safetensors(os.path.join(BERT, "model.safetensors"))
    offset = len(body)
    for i in range(entries):
        header[f"extra.{i}"] = {"dtype": "F32", "shape": [1], "data_offsets": [offset, offset + 4]}
        offset += 4
    text = json.dumps(header, separators=(",", ":"))
    text += " " * (-(len(text) + 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text.encode() + body + bytes(4 * entries))


REPEAT = 3  # each command's least of this many runs


def timed(args):
    """CPU seconds (user + system, all threads) the command took: the work, which other programs
    on the machine disturb far less than they disturb wall-clock time."""
    best = None
    for _ in range(REPEAT):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run([BRISK] + args, capture_output=True, text=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if p.returncode != 0:
            sys.exit(f"{' '.join(args[:3])}...: exit {p.returncode}: {p.stderr.strip()[:300]}")
        seconds = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        best = seconds if best is None else min(best, seconds)
    return best


def run_both(tmp, n):
    """Seconds of `train` on a JSON Lines file and of `forward-backward` on weights of n entries."""
    jsonl = os.path.join(tmp, f"keys{n}.jsonl")
    write_jsonl(jsonl, n)
    t_jsonl = timed(["train", "--model", "bert-tiny", "--tokenizer_name", WORDPIECE,
                     "--train_file", jsonl, "--text_column_name", "sentence", "--max_steps", "1",
                     "--per_device_train_batch_size", "2", "--save_strategy", "no",
                     "--tokenized_cache_dir", "none",
                     "--output_dir", os.path.join(tmp, f"out{n}")])
    weights = os.path.join(tmp, f"entries{n}.safetensors")
    write_safetensors(weights, n)
    t_st = timed(["forward-backward", "--config", BERT + "/", "--batch",
                  os.path.join(BERT, "batch.safetensors"), "--weights", weights,
                  "--output", os.path.join(tmp, "fb.safetensors")])
    return os.path.getsize(jsonl), t_jsonl, os.path.getsize(weights), t_st


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000,10000,100000", help="entries per file, 10x apart")
    sizes = [int(s) for s in ap.parse_args().sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="brisk_bounded_") as tmp:
        # Size 0: two rows and bert_tiny's own weights, what every run costs (start, model, step).
        rows = [(n,) + run_both(tmp, n) for n in [0] + sizes]
    print(f"CPU: {cpu_name()}")
    print("| entries | JSON Lines bytes | train CPU s | ratio | safetensors bytes |"
          " forward-backward CPU s | ratio |")
    print("|---|---|---|---|---|---|---|")
    prev = None
    for n, jb, tj, sb, ts in rows:
        rj = f"{tj / prev[0]:.1f}x" if prev else "-"
        rs = f"{ts / prev[1]:.1f}x" if prev else "-"
        print(f"| {n:,} | {jb:,} | {tj:.2f} | {rj} | {sb:,} | {ts:.2f} | {rs} |")
        prev = (tj, ts) if n else None


if __name__ == "__main__":
    main()
