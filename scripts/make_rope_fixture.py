#!/usr/bin/env python3
"""Rotary position embedding tables as transformers computes them: the fixture of the C++ test of
brisk's rope_tables (src/backend/rope.h).

For each case it builds a LlamaConfig with the case's rope_parameters, runs transformers' own
LlamaRotaryEmbedding (its rope init function for the type, then its forward at a few positions)
and writes tests/fixtures/rope/tables.json: inv_freq [D/2] and the first halves of cos and sin
[positions, D/2] (the second halves repeat them), float32 values written exactly.

Run:  /work/main/.venv/bin/python scripts/make_rope_fixture.py   (or .venv/bin/python)
"""
import json
import os

import torch
import transformers
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "rope", "tables.json")

# Far positions too: there float32 rounding of position * inv_freq dominates, and brisk must
# round the same way to give the same angles.
POSITIONS = [0, 1, 17, 100, 1000, 4095, 8191]

CASES = [
    # Llama-2 style: rope_theta 10000, head_dim 64 (hidden 256 over 4 heads, head_dim derived).
    {"name": "default_llama2", "head_dim": 64, "rope": {"rope_type": "default", "rope_theta": 10000.0}},
    # Qwen2: theta 1e6, head_dim 128.
    {"name": "default_qwen2", "head_dim": 128, "rope": {"rope_type": "default", "rope_theta": 1000000.0}},
    # An odd-ish head dim (multiple of 2, not of 4) to keep the half-split honest.
    {"name": "default_d6", "head_dim": 6, "rope": {"rope_type": "default", "rope_theta": 10000.0}},
    {"name": "linear_x4", "head_dim": 64, "rope": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}},
    # Llama-3.1 (factor 8) and Llama-3.2 (factor 32).
    {"name": "llama3_1", "head_dim": 128,
     "rope": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
    {"name": "llama3_2", "head_dim": 64,
     "rope": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
]


def floats(t):
    # float32 -> Python float is exact, and json writes a float so that it reads back the same.
    return [float(v) for v in t.reshape(-1).tolist()]


def main():
    out = {"transformers": transformers.__version__, "positions": POSITIONS, "cases": []}
    for case in CASES:
        D = case["head_dim"]
        heads = 4
        config = LlamaConfig(hidden_size=D * heads, num_attention_heads=heads,
                             num_key_value_heads=heads, head_dim=D, intermediate_size=32,
                             num_hidden_layers=1, vocab_size=16, max_position_embeddings=131072,
                             rope_parameters=dict(case["rope"]))
        rotary = LlamaRotaryEmbedding(config)
        assert rotary.attention_scaling == 1.0, case["name"]
        x = torch.zeros(1, dtype=torch.float32)
        pos = torch.tensor([POSITIONS], dtype=torch.int64)
        cos, sin = rotary(x, pos)  # [1, P, D]
        half = D // 2
        assert torch.equal(cos[..., :half], cos[..., half:]) and torch.equal(sin[..., :half], sin[..., half:])
        entry = {"name": case["name"], "head_dim": D, **case["rope"]}
        entry["inv_freq"] = floats(rotary.inv_freq)
        entry["cos"] = floats(cos[0, :, :half])
        entry["sin"] = floats(sin[0, :, :half])
        out["cases"].append(entry)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    # One line per case keeps the file small and its diffs readable.
    lines = [json.dumps(c, separators=(",", ":")) for c in out.pop("cases")]
    head = json.dumps(out, separators=(",", ":"))[:-1]
    with open(OUT, "w") as f:
        f.write(head + ',"cases":[\n' + ",\n".join(lines) + "\n]}\n")
    print("wrote", os.path.normpath(OUT))


if __name__ == "__main__":
    main()
