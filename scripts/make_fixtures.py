#!/usr/bin/env python3
"""Regenerates the model fixtures under tests/fixtures/ with PyTorch + transformers.

For a tiny BERT-for-sequence-classification, the same with a regression head (num_labels 1) and
a tiny GPT-2 LM (odd sizes, padding in the batch) it writes, per model folder:
  config.json, model.safetensors   (save_pretrained of the model, fp32)
  batch.safetensors                (input_ids, attention_mask, [token_type_ids], labels; int32,
                                    regression labels float32)
  expected.safetensors             (loss, logits, grad.<parameter name> for every parameter)
Dropout is off (eval mode), attention is the eager implementation. tests/fixtures/bad/ gets the
malformed configs, batches and weights that the error tests feed to the library and the CLI.
Llama-family causal LMs (RMSNorm, rotary embeddings, SwiGLU MLP, grouped-query attention):
llama_tiny (GQA 6/2, explicit head_dim, llama3 rope scaling, attention and MLP biases, untied head,
a pad id inside the text), qwen2_tiny (GQA 4/2, q/k/v biases, tied head) and mistral_tiny (plain
multi-head, linear rope scaling, a sliding window longer than the batch).
gpt2_tiny/generate.json and llama_tiny/generate.json hold transformers' greedy generate()
continuation of a prompt.
tests/fixtures/adamw/ and tests/fixtures/optim/ hold ten-step optimizer runs (AdamW; Adafactor,
SGD and bitsandbytes' 8-bit AdamW) with the raw gradients, the initial and the final values.

Run:  scripts/setup_python.sh && .venv/bin/python scripts/make_fixtures.py [--only optim]
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import (BertConfig, BertForMaskedLM, BertForSequenceClassification, DistilBertConfig,
                          DistilBertForMaskedLM, DistilBertForSequenceClassification, GPT2Config, GPT2LMHeadModel,
                          LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures")


def perturb(model, gen):
    # Random values everywhere (LayerNorm and RMSNorm weights around 1, biases non-zero) so every
    # gradient is tested. RMSNorm: Llama-style input_layernorm, post_attention_layernorm, model.norm.
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen) * 0.2
            if ("LayerNorm" in name or ".ln_" in name or "layernorm" in name
                    or name.endswith("model.norm.weight")):
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
    save_file({k: (v if v.is_floating_point() else v.to(torch.int32)).contiguous()
               for k, v in batch.items()},
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


def bert(gen, regression=False):
    cfg = BertConfig(vocab_size=97, hidden_size=30, num_hidden_layers=2, num_attention_heads=3,
                     intermediate_size=37, max_position_embeddings=23, type_vocab_size=2,
                     num_labels=1 if regression else 3, hidden_act="gelu",
                     attn_implementation="eager")
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
    # Regression: float targets, so transformers takes MSELoss (problem_type "regression").
    labels = torch.tensor([0.75, -1.5, 2.25]) if regression else torch.tensor([2, 0, 1])
    batch = {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": types,
             "labels": labels}
    dump(model, batch, "labels", os.path.join(OUT, "bert_regression" if regression else "bert_tiny"))


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


def distilbert(gen, sinusoidal=False):
    # Pad ids (0) also inside the attended text, so the word embedding's padding_idx matters.
    cfg = DistilBertConfig(vocab_size=97, dim=30, n_layers=2, n_heads=3, hidden_dim=37,
                           max_position_embeddings=23, num_labels=3,
                           activation="relu" if sinusoidal else "gelu",
                           sinusoidal_pos_embds=sinusoidal, pad_token_id=0,
                           attn_implementation="eager")
    model = DistilBertForSequenceClassification(cfg)
    fresh_positions = model.distilbert.embeddings.position_embeddings.weight.detach().clone()
    perturb(model, gen)
    B, T = 3, 11
    lengths = [11, 6, 9]
    input_ids = torch.randint(1, cfg.vocab_size, (B, T), generator=gen)
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
        input_ids[b, n:] = 0
    input_ids[0, 3] = input_ids[2, 5] = 0
    batch = {"input_ids": input_ids, "attention_mask": mask, "labels": torch.tensor([1, 2, 0])}
    name = "distilbert_sinusoidal" if sinusoidal else "distilbert_tiny"
    dump(model, batch, "labels", os.path.join(OUT, name))
    if sinusoidal:  # transformers' initial (sinusoidal) position table, before the perturbation
        save_file({"position_embeddings": fresh_positions.contiguous()},
                  os.path.join(OUT, name, "init.safetensors"))


def bert_decoder(gen):
    # is_decoder: BERT's self-attention becomes causal; relu; pad ids inside the attended text.
    cfg = BertConfig(vocab_size=97, hidden_size=30, num_hidden_layers=2, num_attention_heads=3,
                     intermediate_size=37, max_position_embeddings=23, type_vocab_size=2,
                     num_labels=2, hidden_act="relu", is_decoder=True, pad_token_id=0,
                     attn_implementation="eager")
    model = BertForSequenceClassification(cfg)
    perturb(model, gen)
    B, T = 2, 9
    input_ids = torch.randint(1, cfg.vocab_size, (B, T), generator=gen)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 7:] = 0
    input_ids[1, 7:] = 0
    input_ids[0, 2] = input_ids[1, 4] = 0
    types = torch.zeros(B, T, dtype=torch.long)
    types[:, 5:] = 1
    batch = {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": types,
             "labels": torch.tensor([1, 0])}
    dump(model, batch, "labels", os.path.join(OUT, "bert_decoder"))


def distilbert_mlm(gen):
    # DistilBertForMaskedLM: vocab_transform, the activation, vocab_layer_norm and vocab_projector
    # tied to the word embeddings with its own bias; no token types; labels at the chosen tokens.
    cfg = DistilBertConfig(vocab_size=89, dim=30, n_layers=2, n_heads=5, hidden_dim=41,
                           max_position_embeddings=19, activation="gelu", dropout=0.0,
                           attention_dropout=0.0, pad_token_id=0, attn_implementation="eager")
    model = DistilBertForMaskedLM(cfg)
    assert model.vocab_projector.weight.data_ptr() == \
        model.distilbert.embeddings.word_embeddings.weight.data_ptr()
    perturb(model, gen)
    B, T = 2, 11
    input_ids = torch.randint(5, cfg.vocab_size, (B, T), generator=gen)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 8:] = 0
    input_ids[1, 8:] = 0
    labels = torch.full((B, T), -100)
    for b, t in [(0, 0), (0, 3), (0, 9), (1, 2), (1, 6)]:
        labels[b, t] = input_ids[b, t]
    batch = {"input_ids": input_ids, "attention_mask": mask, "labels": labels}
    dump(model, batch, "labels", os.path.join(OUT, "distilbert_mlm"))


def bert_mlm(gen):
    # BertForMaskedLM: the prediction head's transform (dense, gelu_new, LayerNorm) and the decoder
    # tied to the word embeddings with its own bias; labels only at the chosen tokens.
    cfg = BertConfig(vocab_size=97, hidden_size=30, num_hidden_layers=2, num_attention_heads=3,
                     intermediate_size=37, max_position_embeddings=23, type_vocab_size=2,
                     hidden_act="gelu_new", pad_token_id=0, attn_implementation="eager")
    model = BertForMaskedLM(cfg)
    perturb(model, gen)
    B, T = 3, 10
    input_ids = torch.randint(5, cfg.vocab_size, (B, T), generator=gen)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[2, 6:] = 0
    input_ids[2, 6:] = 0
    labels = torch.full((B, T), -100)
    for b, t in [(0, 1), (0, 4), (0, 8), (1, 2), (1, 3), (2, 1), (2, 5)]:
        labels[b, t] = input_ids[b, t]
        input_ids[b, t] = 4 if (b + t) % 3 else int(torch.randint(5, 97, (1,), generator=gen))
    batch = {"input_ids": input_ids, "attention_mask": mask,
             "token_type_ids": torch.zeros(B, T, dtype=torch.long), "labels": labels}
    dump(model, batch, "labels", os.path.join(OUT, "bert_mlm"))


def gpt2_variant(gen):
    # The GPT-2 options transformers honors beyond the defaults: an untied LM head, attention
    # scaled by 1/(layer+1), reorder_and_upcast_attn (float32 math either way), quick_gelu.
    cfg = GPT2Config(vocab_size=89, n_embd=30, n_layer=3, n_head=5, n_positions=19, n_inner=41,
                     activation_function="quick_gelu", bos_token_id=None, eos_token_id=None,
                     tie_word_embeddings=False, scale_attn_by_inverse_layer_idx=True,
                     reorder_and_upcast_attn=True, attn_implementation="eager")
    model = GPT2LMHeadModel(cfg)
    assert model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr()
    perturb(model, gen)
    B, T = 2, 12
    input_ids = torch.randint(0, cfg.vocab_size, (B, T), generator=gen)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 9:] = 0
    labels = input_ids.clone()
    labels[mask == 0] = -100
    batch = {"input_ids": input_ids, "attention_mask": mask, "labels": labels}
    dump(model, batch, "labels", os.path.join(OUT, "gpt2_variant"))


def causal_batch(gen, vocab, B, T, lengths, pad_id=None):
    # Right padding: the rows past their length are masked out (attention_mask 0, labels -100);
    # labels equal input_ids elsewhere (the model shifts them). With a pad id, the padded tail
    # holds it and so do two attended positions, so the embedding's padding_idx matters.
    input_ids = torch.randint(0, vocab, (B, T), generator=gen)
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
        if pad_id is not None:
            input_ids[b, n:] = pad_id
    if pad_id is not None:
        input_ids[0, 4] = input_ids[1, 2] = pad_id
    labels = input_ids.clone()
    labels[mask == 0] = -100
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def llama(gen):
    # Grouped-query attention 6 query heads over 2 key/value heads, head_dim 6 given explicitly
    # (6 * 6 = 36 projected width against hidden 30, whose derived head_dim would be 5), llama3
    # rope scaling with all three of its branches: the wavelengths 2*pi/inv_freq are 6.3, 49.8 and
    # 395 and the original context 64 keeps the first (< 64/4), smooths the second and divides
    # the third by the factor; q/k/v/o and MLP biases, an untied LM head, pad id 0 inside the
    # attended text.
    cfg = LlamaConfig(vocab_size=101, hidden_size=30, intermediate_size=37, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, head_dim=6, hidden_act="silu",
                      max_position_embeddings=128, rms_norm_eps=1e-5, pad_token_id=0,
                      bos_token_id=None, eos_token_id=None, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "llama3", "rope_theta": 500.0, "factor": 4.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 64},
                      attention_bias=True, mlp_bias=True, attention_dropout=0.0,
                      attn_implementation="eager")
    model = LlamaForCausalLM(cfg)
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    perturb(model, gen)
    batch = causal_batch(gen, cfg.vocab_size, 2, 13, [13, 9], pad_id=0)
    dump(model, batch, "labels", os.path.join(OUT, "llama_tiny"))


def qwen2(gen):
    # Qwen2: biases on q/k/v only, grouped-query attention 4/2 (head_dim 8), default rope, the LM
    # head tied to the embeddings, no sliding window.
    cfg = Qwen2Config(vocab_size=93, hidden_size=32, intermediate_size=45, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, hidden_act="silu",
                      max_position_embeddings=32, rms_norm_eps=1e-6,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                      tie_word_embeddings=True, use_sliding_window=False, attention_dropout=0.0,
                      pad_token_id=None, bos_token_id=None, eos_token_id=None,
                      attn_implementation="eager")
    model = Qwen2ForCausalLM(cfg)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    perturb(model, gen)
    batch = causal_batch(gen, cfg.vocab_size, 2, 11, [11, 7])
    dump(model, batch, "labels", os.path.join(OUT, "qwen2_tiny"))


def mistral(gen):
    # Mistral: no biases, plain multi-head attention (3 key/value heads for 3 query heads),
    # head_dim 10, linear rope scaling, a sliding window (64) longer than the batch.
    cfg = MistralConfig(vocab_size=97, hidden_size=30, intermediate_size=41, num_hidden_layers=2,
                        num_attention_heads=3, num_key_value_heads=3, head_dim=10,
                        hidden_act="silu", max_position_embeddings=32, rms_norm_eps=1e-5,
                        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                         "factor": 2.0},
                        sliding_window=64, tie_word_embeddings=False, attention_dropout=0.0,
                        pad_token_id=None, bos_token_id=None, eos_token_id=None,
                        attn_implementation="eager")
    model = MistralForCausalLM(cfg)
    perturb(model, gen)
    batch = causal_batch(gen, cfg.vocab_size, 2, 12, [12, 8])
    dump(model, batch, "labels", os.path.join(OUT, "mistral_tiny"))


def llama_fixtures():
    llama(torch.Generator().manual_seed(9753))
    qwen2(torch.Generator().manual_seed(8642))
    mistral(torch.Generator().manual_seed(7531))
    greedy_generation("llama_tiny", LlamaForCausalLM)


def greedy_generation(name="gpt2_tiny", cls=GPT2LMHeadModel, **load):
    # transformers' greedy generate() on a saved tiny causal LM: the first row's first 5 tokens
    # as the prompt, 10 new tokens (gpt2_tiny's n_positions is 19); `load` goes to from_pretrained.
    folder = os.path.join(OUT, name)
    model = cls.from_pretrained(folder, attn_implementation="eager", **load).eval()
    from safetensors.torch import load_file
    prompt = load_file(os.path.join(folder, "batch.safetensors"))["input_ids"][:1, :5].long()
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=10,
                             do_sample=False, pad_token_id=0)
    data = {"prompt": prompt[0].tolist(), "greedy": out[0, prompt.shape[1]:].tolist()}
    with open(os.path.join(folder, "generate.json"), "w") as f:
        json.dump(data, f)
        f.write("\n")
    print(f"{folder}/generate.json: {data}")


def bad_inputs():
    """Malformed inputs for the error tests: each must end with one clear message."""
    folder = os.path.join(OUT, "bad")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(OUT, "bert_tiny", "config.json")) as f:
        good = json.load(f)
    def write_config(name, cfg):
        with open(os.path.join(folder, name), "w") as f:
            json.dump(cfg, f, indent=1)
    with open(os.path.join(folder, "not_json.json"), "w") as f:
        f.write('{"model_type": "bert", "hidden_size": 30,,}')
    write_config("missing_size.json", {k: v for k, v in good.items() if k != "hidden_size"})
    write_config("negative_size.json", dict(good, num_hidden_layers=-2))
    write_config("unknown_type.json", dict(good, model_type="mamba"))
    write_config("heads_not_dividing.json", dict(good, num_attention_heads=4))
    gen = torch.Generator().manual_seed(99)
    long_ids = torch.randint(1, 97, (1, good["max_position_embeddings"] + 1), generator=gen)
    save_file({"input_ids": long_ids.to(torch.int32), "labels": torch.tensor([1], dtype=torch.int32)},
              os.path.join(folder, "batch_too_long.safetensors"))
    ids = torch.randint(1, 97, (2, 5), generator=gen)
    ids[1, 3] = 97  # one past the vocabulary
    save_file({"input_ids": ids.to(torch.int32), "labels": torch.tensor([0, 1], dtype=torch.int32)},
              os.path.join(folder, "batch_bad_token.safetensors"))
    with open(os.path.join(OUT, "bert_tiny", "model.safetensors"), "rb") as f:
        data = f.read()
    with open(os.path.join(folder, "truncated.safetensors"), "wb") as f:
        f.write(data[: len(data) // 2])
    print(f"{folder}: malformed inputs written")


def adamw_steps():
    """Ten AdamW steps with weight-decay groups, a linear warm-up/decay schedule and global-norm
    clipping, as transformers' Trainer runs them (optim adamw_torch)."""
    from transformers import get_linear_schedule_with_warmup
    gen = torch.Generator().manual_seed(7)
    shapes = {"w.weight": (5, 7), "w.bias": (5,), "norm.weight": (7,), "emb.weight": (11, 3)}
    decay = {"w.weight": True, "w.bias": False, "norm.weight": False, "emb.weight": True}
    params = {n: torch.nn.Parameter(torch.randn(s, generator=gen)) for n, s in shapes.items()}
    initial = {"init." + n: p.detach().clone() for n, p in params.items()}
    opt = torch.optim.AdamW(
        [{"params": [p for n, p in params.items() if decay[n]], "weight_decay": 0.1},
         {"params": [p for n, p in params.items() if not decay[n]], "weight_decay": 0.0}],
        lr=1e-2, betas=(0.9, 0.98), eps=1e-6)
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=3, num_training_steps=10)
    grads = {}
    for step in range(10):
        for n, p in params.items():
            # Large enough that clipping to 1.0 is active on most steps.
            p.grad = torch.randn(p.shape, generator=gen) * (0.3 + step * 0.1)
            grads[f"grad.{step}.{n}"] = p.grad.detach().clone()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()
        sched.step()
    final = {"final." + n: p.detach().clone() for n, p in params.items()}
    os.makedirs(os.path.join(OUT, "adamw"), exist_ok=True)
    save_file({**initial, **grads, **final}, os.path.join(OUT, "adamw", "steps.safetensors"))
    print("adamw: 10 steps written")


# The parameter set shared by the optimizer fixtures: name -> (shape, takes weight decay).
OPTIM_PARAMS = {"w.weight": ((5, 7), True), "w.bias": ((5,), False),
                "norm.weight": ((7,), False), "emb.weight": ((11, 3), True)}


def optim_inputs(seed, spec, steps=10):
    """Initial values and the raw (unclipped) gradients of every step, drawn once so that every
    variant starts from the same values and sees the same gradients."""
    gen = torch.Generator().manual_seed(seed)
    init = {n: torch.randn(shape, generator=gen) for n, (shape, _) in spec.items()}
    grads = []
    for step in range(steps):
        # Large enough that clipping to 1.0 is active on most steps.
        grads.append({n: torch.randn(shape, generator=gen) * (0.3 + step * 0.1)
                      for n, (shape, _) in spec.items()})
    return init, grads


def optim_run(spec, init, grads, make_opt, weight_decay, schedule=True):
    """Runs one variant on clones of init: the two parameter groups as transformers' Trainer
    builds them, global-norm clipping to 1.0, then opt.step() and (optionally) a linear
    warm-up/decay schedule over 3 + 7 steps. Returns the parameters and the optimizer."""
    from transformers import get_linear_schedule_with_warmup
    params = {n: torch.nn.Parameter(v.clone()) for n, v in init.items()}
    groups = [{"params": [p for n, p in params.items() if spec[n][1]], "weight_decay": weight_decay},
              {"params": [p for n, p in params.items() if not spec[n][1]], "weight_decay": 0.0}]
    opt = make_opt(groups)
    sched = (get_linear_schedule_with_warmup(opt, num_warmup_steps=3, num_training_steps=len(grads))
             if schedule else None)
    for step_grads in grads:
        for n, p in params.items():
            p.grad = step_grads[n].clone()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()
        if sched is not None:
            sched.step()
    return params, opt


def optim_save(file, init, grads, finals, extra, init_key="init", grad_key="grad", final_key="final"):
    tensors = {f"{init_key}.{n}": v for n, v in init.items()}
    for step, step_grads in enumerate(grads):
        tensors.update({f"{grad_key}.{step}.{n}": g for n, g in step_grads.items()})
    for variant, params in finals.items():
        prefix = f"{final_key}.{variant}." if variant else f"{final_key}."
        tensors.update({prefix + n: p.detach().clone() for n, p in params.items()})
    tensors.update(extra)
    folder = os.path.join(OUT, "optim")
    os.makedirs(folder, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(folder, file))
    print(f"optim/{file}: {len(tensors)} tensors written")


def adafactor_steps():
    """Ten transformers Adafactor steps: as the Trainer configures optim adafactor (fixed lr,
    no parameter scaling, linear schedule), with beta1 and parameter scaling, and with the
    relative step size (warm-up init, no schedule, no weight decay)."""
    from transformers.optimization import Adafactor
    init, grads = optim_inputs(7, OPTIM_PARAMS)
    variants = {
        "trainer": (lambda g: Adafactor(g, lr=1e-2, scale_parameter=False, relative_step=False),
                    0.1, True),
        "beta1_scale": (lambda g: Adafactor(g, lr=1e-2, scale_parameter=True, relative_step=False,
                                            beta1=0.9), 0.1, True),
        "relative": (lambda g: Adafactor(g, lr=None, scale_parameter=True, relative_step=True,
                                         warmup_init=True), 0.0, False),
    }
    finals, extra = {}, {}
    for variant, (make_opt, wd, schedule) in variants.items():
        params, opt = optim_run(OPTIM_PARAMS, init, grads, make_opt, wd, schedule)
        finals[variant] = params
        if variant == "trainer":
            w, b = opt.state[params["w.weight"]], opt.state[params["w.bias"]]
            extra["state.trainer.w.weight.exp_avg_sq_row"] = w["exp_avg_sq_row"].clone()
            extra["state.trainer.w.weight.exp_avg_sq_col"] = w["exp_avg_sq_col"].clone()
            extra["state.trainer.w.bias.exp_avg_sq"] = b["exp_avg_sq"].clone()
    optim_save("adafactor.safetensors", init, grads, finals, extra)


def sgd_steps():
    """Ten torch.optim.SGD steps with the linear schedule: Nesterov momentum, momentum with
    dampening, and plain SGD."""
    init, grads = optim_inputs(7, OPTIM_PARAMS)
    variants = {
        "nesterov": (lambda g: torch.optim.SGD(g, lr=1e-2, momentum=0.9, nesterov=True), 0.1),
        "dampening": (lambda g: torch.optim.SGD(g, lr=1e-2, momentum=0.9, dampening=0.1), 0.1),
        "plain": (lambda g: torch.optim.SGD(g, lr=1e-2), 0.0),
    }
    finals, extra = {}, {}
    for variant, (make_opt, wd) in variants.items():
        params, opt = optim_run(OPTIM_PARAMS, init, grads, make_opt, wd)
        finals[variant] = params
        if variant == "nesterov":
            extra["state.nesterov.w.weight.momentum_buffer"] = \
                opt.state[params["w.weight"]]["momentum_buffer"].clone()
    optim_save("sgd.safetensors", init, grads, finals, extra)


def adamw8bit_steps():
    """bitsandbytes' dynamic quantization maps and, where bitsandbytes runs on CPU tensors, ten
    8-bit AdamW steps (as the Trainer's adamw_bnb_8bit: bnb.optim.AdamW with optim_bits=8).
    big.weight (5250 elements) gets block-wise 8-bit state (blocks of 256, the last one partial),
    small.weight (600 < min_8bit_size 4096) and big.bias get 32-bit state."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as F
    maps = {"qmap.signed": F.create_dynamic_map(signed=True).float().clone(),
            "qmap.unsigned": F.create_dynamic_map(signed=False).float().clone()}
    for key, m in maps.items():
        print(f"{key}: {m.numel()} values, sorted {bool((m[1:] >= m[:-1]).all())}, "
              f"zeros {int((m == 0).sum())}")
        print("  " + " ".join(f"{v:.9g}" for v in m.tolist()))
    spec = {"big.weight": ((70, 75), True), "small.weight": ((20, 30), True),
            "big.bias": ((70,), False)}
    init, grads = optim_inputs(11, spec)
    make_opt = lambda g: bnb.optim.AdamW(g, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, optim_bits=8)
    try:
        params, opt = optim_run(spec, init, grads, make_opt, 0.01, schedule=False)
    except Exception as e:  # bitsandbytes without a CPU backend: the maps alone
        print(f"bitsandbytes {bnb.__version__}: 8-bit AdamW does not run on CPU: {e!r}")
        optim_save("adamw8bit.safetensors", {}, [], {}, maps)
        return
    big, small = opt.state[params["big.weight"]], opt.state[params["small.weight"]]
    assert big["state1"].dtype == torch.uint8 and big["absmax1"].numel() == 21, big.keys()
    assert small["state1"].dtype == torch.float32
    extra = dict(maps)
    for k in ("state1", "state2", "absmax1", "absmax2"):
        extra[f"state8.big.weight.{k}"] = big[k].clone()
    for k in ("state1", "state2"):
        extra[f"state8.small.weight.{k}"] = small[k].clone()
    optim_save("adamw8bit.safetensors", init, grads, {"": params}, extra,
               init_key="init8", grad_key="grad8", final_key="final8")


def optim_fixtures():
    adafactor_steps()
    sgd_steps()
    adamw8bit_steps()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=("models", "regression", "generate", "adamw", "optim",
                                           "zoo", "mlm", "llama"),
                        help="regenerate one fixture set (models: bert_tiny, gpt2_tiny and bad/; "
                             "regression: bert_regression; zoo: distilbert_*, bert_decoder, "
                             "gpt2_variant; mlm: bert_mlm; llama: llama_tiny with its "
                             "generate.json, qwen2_tiny, mistral_tiny)")
    args = parser.parse_args()
    if args.only in (None, "models"):
        torch.manual_seed(0)
        gen = torch.Generator().manual_seed(1234)
        bert(gen)
        gpt2(gen)
        bad_inputs()
    if args.only in (None, "regression"):  # its own generator: the others stay as they were
        torch.manual_seed(0)
        bert(torch.Generator().manual_seed(4321), regression=True)
    if args.only in (None, "zoo"):  # its own generator too
        torch.manual_seed(0)
        gen = torch.Generator().manual_seed(2468)
        distilbert(gen)
        distilbert(gen, sinusoidal=True)
        bert_decoder(gen)
        gpt2_variant(gen)
    if args.only in (None, "mlm"):  # its own generator: the zoo stays as it was
        torch.manual_seed(0)
        bert_mlm(torch.Generator().manual_seed(1357))
        distilbert_mlm(torch.Generator().manual_seed(8080))  # its own: bert_mlm stays as it was
    if args.only in (None, "llama"):  # one generator per model: the others stay as they were
        torch.manual_seed(0)
        llama_fixtures()
    if args.only in (None, "generate"):
        greedy_generation()
    if args.only in (None, "adamw"):
        adamw_steps()
    if args.only in (None, "optim"):
        optim_fixtures()
    return 0


if __name__ == "__main__":
    sys.exit(main())
