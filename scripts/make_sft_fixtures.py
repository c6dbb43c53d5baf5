#!/usr/bin/env python3
"""Regenerates tests/fixtures/sft/: a causal LM fine-tuned on rows, as TRL's SFTTrainer prepares
a plain dataset, computed with plain PyTorch + transformers one row at a time (no padding).

Two tiny models with random weights (config.json + model.safetensors, as save_pretrained writes
them): gpt2/ on the byte-level BPE tokenizer fixture (tokenizer/bpe, eos "<|endoftext|>" = 0, no
template) and llama/ on the Llama-3-style one (tokenizer/bpe_llama3, "<|begin_of_text|>" in front,
eos "<|end_of_text|>" = 1); each config's eos_token_id names the eos. Two files of rows:
pairs.jsonl (prompt and completion columns, an empty prompt among them, and a prompt
longer than the limit) and lines.txt (text lines,
two blank). Each row tokenized as TRL 1.x does: the completion (or text) gets the eos token's text
appended unless it ends with it; a pair is tokenized as prompt + completion, its completion
starting where the prompt tokenized alone and the pair's tokens part; then cut to BLOCK tokens
(keep_start), a row left without a label dropped.

expected.json, for each model and run (pairs: completion_only_loss true; pairs_all: false;
lines): "samples" (each kept row's ids and its unlearned prefix), "losses" (each of STEPS SGD
steps' loss over all the rows in one batch, lr LR, no clipping, no decay: the sum of each row's
token losses over all the rows' targets) and "eval_loss" (the same loss after the last step).

Run:  scripts/setup_python.sh && .venv/bin/python scripts/make_sft_fixtures.py
"""
import json
import os
import shutil

import torch
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          PreTrainedTokenizerFast)

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures")
OUT = os.path.join(FIXTURES, "sft")
BLOCK = 24
STEPS = 3
LR = 0.5

PAIRS = [
    ("Question: who led the people out of Egypt?\nAnswer:", " Moses, by the hand of the Lord."),
    ("Translate: in the beginning", " God created the heaven and the earth."),
    ("", " And the earth was without form, and void."),
    ("Finish the verse: The Lord is my shepherd;", " I shall not want."),
    ("Say it plainly:", " Let there be light: and there was light, and the light was good, and "
     "God divided the light from the darkness, and called the light Day."),
    ("Name the river:", " Jordan"),
    ("Where did Noah's ark rest?", " Upon the mountains of Ararat."),
    ("Count:", " one, two, three"),
    ("Recite the first verse of Genesis, then the second one, word for word and without a "
     "single mistake:", " In the beginning."),
]
LINES = [
    "In the beginning God created the heaven and the earth.",
    "",
    "And God said, Let there be light: and there was light.",
    "Jesus wept.",
    "   ",
    "And God saw the light, that it was good: and God divided the light from the darkness, and "
    "God called the light Day, and the darkness he called Night.",
    "The Lord is my shepherd; I shall not want.",
    "Rejoice evermore.",
    "Pray without ceasing.",
    "And the evening and the morning were the first day.",
]


def models():
    torch.manual_seed(7)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=800, n_embd=16, n_layer=2, n_head=2,
                                      n_positions=48, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=900, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, max_position_embeddings=64,
                                         bos_token_id=0, eos_token_id=1,
                                         tie_word_embeddings=False))
    return {"gpt2": (gpt2, "bpe", "<|endoftext|>"), "llama": (llama, "bpe_llama3", "<|end_of_text|>")}


def trl_samples(tok, eos, run):
    """The rows as TRL's SFTTrainer tokenizes, labels and truncates them: (ids, unlearned)."""
    out = []
    rows = LINES if run == "lines" else PAIRS
    for row in rows:
        if run == "lines":
            if not row.strip():
                continue  # --line_by_line leaves blank lines out
            text = row if row.endswith(eos) else row + eos
            ids, prompt = tok(text)["input_ids"], 0
        else:
            p, c = row
            c = c if c.endswith(eos) else c + eos
            alone = tok(p)["input_ids"]
            ids = tok(p + c)["input_ids"]
            prompt = 0
            while prompt < min(len(alone), len(ids)) and alone[prompt] == ids[prompt]:
                prompt += 1
            if run == "pairs_all":
                prompt = 0
        ids = ids[:BLOCK]
        if prompt >= len(ids):
            continue  # no label left: TRL drops the row
        out.append((ids, prompt))
    return out


def batch_loss(model, samples):
    """Each row alone (no padding): the sum of its targets' losses, over all rows' targets."""
    total, targets = 0.0, 0
    for ids, prompt in samples:
        x = torch.tensor([ids])
        labels = x.clone()
        labels[0, :prompt] = -100
        logits = model(input_ids=x).logits[0, :-1]
        y = labels[0, 1:]
        total = total + torch.nn.functional.cross_entropy(logits, y, ignore_index=-100,
                                                          reduction="sum")
        targets += int((y != -100).sum())
    return total / targets


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    with open(os.path.join(OUT, "pairs.jsonl"), "w") as f:
        for p, c in PAIRS:
            f.write(json.dumps({"prompt": p, "completion": c}) + "\n")
    with open(os.path.join(OUT, "lines.txt"), "w") as f:
        f.write("\n".join(LINES) + "\n")
    expected = {}
    for name, (model, tokenizer, eos) in models().items():
        folder = os.path.join(OUT, name)
        model.save_pretrained(folder, safe_serialization=True)
        for extra in ("generation_config.json",):
            if os.path.exists(os.path.join(folder, extra)):
                os.remove(os.path.join(folder, extra))
        tok = PreTrainedTokenizerFast(
            tokenizer_file=os.path.join(FIXTURES, "tokenizer", tokenizer, "tokenizer.json"),
            eos_token=eos)
        initial = {k: v.clone() for k, v in model.state_dict().items()}
        for run in ("pairs", "pairs_all", "lines"):
            model.load_state_dict(initial)
            model.train()
            samples = trl_samples(tok, eos, run)
            opt = torch.optim.SGD(model.parameters(), lr=LR)
            losses = []
            for _ in range(STEPS):
                loss = batch_loss(model, samples)
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.item())
            model.eval()
            with torch.no_grad():
                eval_loss = batch_loss(model, samples).item()
            expected[f"{name}/{run}"] = {
                "samples": [{"ids": ids, "unlearned": prompt} for ids, prompt in samples],
                "losses": losses,
                "eval_loss": eval_loss,
            }
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump({"block_size": BLOCK, "steps": STEPS, "learning_rate": LR, "runs": expected},
                  f, indent=1)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
