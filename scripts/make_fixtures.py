#!/usr/bin/env python3
"""Regenerates the model fixtures under tests/fixtures/ with PyTorch + transformers.

For a tiny BERT-for-sequence-classification and a tiny GPT-2 LM (odd sizes, padding in the
batch) it writes, per model folder:
  config.json, model.safetensors   (save_pretrained of the model, fp32)
  batch.safetensors                (input_ids, attention_mask, [token_type_ids], labels; int32)
  expected.safetensors             (loss, logits, grad.<parameter name> for every parameter)
Dropout is off (eval mode), attention is the eager implementation.

Run:  scripts/setup_python.sh && .venv/bin/python scripts/make_fixtures.py
"""
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures")


def perturb(model, gen):
    # Random values everywhere (LayerNorm around 1, biases non-zero) so every gradient is tested.
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen) * 0.2
            if "LayerNorm" in name or ".ln_" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + noise * 0.5)
            else:
                p.copy_(noise)


def dump(model, batch, labels_key, folder):
    os.makedirs(folder, exist_ok=True)
    model.eval()
    model.zero_grad()
    out = model(**batch)
    out.loss.backward()
    model.save_pretrained(folder, safe_serialization=True)
    gen_cfg = os.path.join(folder, "generation_config.json")
    if os.path.exists(gen_cfg):
        os.remove(gen_cfg)
    save_file({k: v.to(torch.int32).contiguous() for k, v in batch.items()},
              os.path.join(folder, "batch.safetensors"))
    expected = {"loss": out.loss.detach().reshape(()).contiguous(),
                "logits": out.logits.detach().contiguous()}
    seen = set()
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        expected["grad." + name] = p.grad.detach().contiguous()
    save_file(expected, os.path.join(folder, "expected.safetensors"))
    print(f"{folder}: loss {out.loss.item():.6f}, {len(expected) - 2} gradients")


def bert(gen):
    cfg = BertConfig(vocab_size=97, hidden_size=30, num_hidden_layers=2, num_attention_heads=3,
                     intermediate_size=37, max_position_embeddings=23, type_vocab_size=2,
                     num_labels=3, hidden_act="gelu", attn_implementation="eager")
    model = BertForSequenceClassification(cfg)
    perturb(model, gen)
    B, T = 3, 11
    lengths = [11, 7, 4]
    input_ids = torch.randint(1, cfg.vocab_size, (B, T), generator=gen)
    mask = torch.zeros(B, T, dtype=torch.long)
    types = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
        types[b, n // 2:n] = 1
        input_ids[b, n:] = 0
    labels = torch.tensor([2, 0, 1])
    batch = {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": types,
             "labels": labels}
    dump(model, batch, "labels", os.path.join(OUT, "bert_tiny"))


def gpt2(gen):
    cfg = GPT2Config(vocab_size=89, n_embd=30, n_layer=2, n_head=3, n_positions=19, n_inner=None,
                     activation_function="gelu_new", bos_token_id=None, eos_token_id=None,
                     attn_implementation="eager")
    model = GPT2LMHeadModel(cfg)
    perturb(model, gen)
    B, T = 2, 13
    lengths = [13, 8]
    input_ids = torch.randint(0, cfg.vocab_size, (B, T), generator=gen)
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    labels = input_ids.clone()
    labels[mask == 0] = -100
    batch = {"input_ids": input_ids, "attention_mask": mask, "labels": labels}
    dump(model, batch, "labels", os.path.join(OUT, "gpt2_tiny"))


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1234)
    bert(gen)
    gpt2(gen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
