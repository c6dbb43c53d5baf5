#!/usr/bin/env python3
"""Regenerates the mixture-of-experts fixtures under tests/fixtures/moe/ with PyTorch + transformers.

Sparse MoE blocks alone (<name>.safetensors): transformers' MixtralSparseMoeBlock (top 2 of 5,
renormalized), Qwen2MoeSparseMoeBlock (top 2 of 5, not renormalized, a shared expert of 9 under
its sigmoid gate) and OlmoeSparseMoeBlock (top 3 of 6, norm_topk_prob false, and true), fp32, on
random hidden states x [2, 7, 12] with an upstream gradient dy (the experts' eager loop:
transformers' grouped_mm default needs 16-byte strides, which the odd sizes here do not have):
  x, dy, y (the block's output), grad.x, and for each parameter param.<name> and grad.<name>
  (the router's weight, the experts as the block holds them), with its shape as transformers has it.
Whole causal LMs (mixtral_tiny/, qwen2_moe_tiny/, olmoe_tiny/, as scripts/make_fixtures.py writes
its models: config.json, model.safetensors as save_pretrained writes it, batch.safetensors,
expected.safetensors with loss, logits, aux_loss and grad.<parameter>), with output_router_logits
so that the load-balancing loss is in the loss; padding in the batch. Then a few training steps
of mixtral_tiny and qwen2_moe_tiny from those files (train_steps.safetensors: each step's loss,
and every parameter after the last step): the batch each step, AdamW (lr 1e-2, betas 0.9/0.999,
eps 1e-8, no weight decay), gradients clipped to norm 1, a constant learning rate, as
`brisk train` runs them with those options. And transformers' greedy generate() on the three
(generate.json: a 5-token prompt and the 10 tokens after it). z_loss.safetensors: the
router z-loss (coef 0.1) added to their loss, and the gradients. mixtral_tiny/packed/ and
qwen2_moe_tiny/packed/: their weights as transformers 5 holds them in memory (packed experts),
sharded, as save_pretrained(save_original_format=False) writes them.

Run:  scripts/setup_python.sh && .venv/bin/python scripts/make_moe_fixtures.py
"""
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import MixtralConfig, OlmoeConfig, Qwen2MoeConfig
from transformers import MixtralForCausalLM, OlmoeForCausalLM, Qwen2MoeForCausalLM
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
from transformers.models.olmoe.modeling_olmoe import OlmoeSparseMoeBlock
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_fixtures import dump, greedy_generation, perturb  # noqa: E402

OUT = os.path.join(HERE, "..", "tests", "fixtures", "moe")


def block(name, module, gen):
    perturb(module, gen)
    x = torch.randn(2, 7, 12, generator=gen, requires_grad=True)
    dy = torch.randn(2, 7, 12, generator=gen)
    out = module(x)
    y = out[0] if isinstance(out, tuple) else out
    (y * dy).sum().backward()
    tensors = {"x": x.detach(), "dy": dy, "y": y.detach(), "grad.x": x.grad}
    for pname, p in module.named_parameters():
        tensors["param." + pname] = p.detach()
        tensors["grad." + pname] = p.grad
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(OUT, name + ".safetensors"))
    print(name, {k: tuple(v.shape) for k, v in tensors.items() if k.startswith("param.")})


def blocks(gen):
    mixtral = MixtralConfig(hidden_size=12, intermediate_size=7, num_local_experts=5,
                            num_experts_per_tok=2, experts_implementation="eager")
    block("mixtral_block", MixtralSparseMoeBlock(mixtral), gen)
    qwen2 = Qwen2MoeConfig(hidden_size=12, moe_intermediate_size=7, num_experts=5,
                           num_experts_per_tok=2, norm_topk_prob=False,
                           shared_expert_intermediate_size=9, experts_implementation="eager")
    block("qwen2_moe_block", Qwen2MoeSparseMoeBlock(qwen2), gen)
    for norm in (False, True):
        olmoe = OlmoeConfig(hidden_size=12, intermediate_size=7, num_experts=6,
                            num_experts_per_tok=3, norm_topk_prob=norm,
                            experts_implementation="eager")
        block("olmoe_block" + ("_normalized" if norm else ""), OlmoeSparseMoeBlock(olmoe), gen)


def causal_batch(vocab, gen):
    B, T = 2, 9
    input_ids = torch.randint(0, vocab, (B, T), generator=gen)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 6:] = 0
    labels = input_ids.clone()
    labels[mask == 0] = -100
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def models(gen):
    common = dict(vocab_size=61, hidden_size=12, num_hidden_layers=2, num_attention_heads=3,
                  num_key_value_heads=1, max_position_embeddings=32, output_router_logits=True,
                  router_aux_loss_coef=0.05, attn_implementation="eager",
                  experts_implementation="eager")
    specs = [
        ("mixtral_tiny", MixtralForCausalLM,
         MixtralConfig(intermediate_size=7, num_local_experts=5, num_experts_per_tok=2, **common)),
        ("qwen2_moe_tiny", Qwen2MoeForCausalLM,
         Qwen2MoeConfig(intermediate_size=11, moe_intermediate_size=7, num_experts=6,
                        num_experts_per_tok=2, norm_topk_prob=False,
                        shared_expert_intermediate_size=9, decoder_sparse_step=1,
                        mlp_only_layers=[1], tie_word_embeddings=True, **common)),
        ("olmoe_tiny", OlmoeForCausalLM,
         OlmoeConfig(intermediate_size=7, num_experts=6, num_experts_per_tok=3,
                     norm_topk_prob=False, eos_token_id=None, pad_token_id=None, **common)),
    ]
    for name, cls, cfg in specs:
        model = cls(cfg)
        perturb(model, gen)
        folder = os.path.join(OUT, name)
        batch = causal_batch(cfg.vocab_size, gen)
        dump(model, batch, "labels", folder)
        model.eval()
        aux = model(**batch).aux_loss
        if aux is not None:  # the load-balancing loss alone, beside dump's files
            save_file({"aux_loss": aux.detach().reshape(()).contiguous()},
                      os.path.join(folder, "aux_loss.safetensors"))


TRAIN_STEPS = 3


def saved_models():
    """The saved tiny Mixtral and Qwen2-MoE: each one's folder, model (eager experts) and batch."""
    from safetensors.torch import load_file
    for name, cls in (("mixtral_tiny", MixtralForCausalLM), ("qwen2_moe_tiny", Qwen2MoeForCausalLM)):
        folder = os.path.join(OUT, name)
        model = cls.from_pretrained(folder, attn_implementation="eager",
                                    experts_implementation="eager")
        batch = {k: v.long() for k, v in load_file(os.path.join(folder, "batch.safetensors")).items()}
        yield folder, model, batch


def train_steps():
    """Trains the saved tiny models on their saved batch (train_steps.safetensors)."""
    for folder, model, batch in saved_models():
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=0.0)
        losses = []
        for _ in range(TRAIN_STEPS):
            loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        out = {"losses": torch.tensor(losses, dtype=torch.float32)}
        for n, p in model.named_parameters():
            out["final." + n] = p.detach().contiguous()
        save_file(out, os.path.join(folder, "train_steps.safetensors"))


Z_LOSS_COEF = 0.1


def z_losses():
    """ST-MoE's router z-loss added to the saved tiny models' loss (z_loss.safetensors: z_loss,
    the total loss and every gradient): Z_LOSS_COEF x the mean over the sparse layers and the
    unmasked tokens of logsumexp(router logits)^2, as `brisk train --router_z_loss_coef` adds it."""
    for folder, model, batch in saved_models():
        model.eval()
        out = model(**batch)
        mask = batch["attention_mask"].reshape(-1).float()
        lse = torch.stack([torch.logsumexp(r.float(), dim=-1) for r in out.router_logits])
        z = Z_LOSS_COEF * (lse.square() * mask).sum() / (len(out.router_logits) * mask.sum())
        loss = out.loss + z
        loss.backward()
        data = {"z_loss": z.detach().reshape(()), "loss": loss.detach().reshape(())}
        for n, p in model.named_parameters():
            data["grad." + n] = p.grad.detach().contiguous()
        save_file(data, os.path.join(folder, "z_loss.safetensors"))


def generations():
    """transformers' greedy generate() on the saved tiny models (generate.json)."""
    for name, cls in (("mixtral_tiny", MixtralForCausalLM), ("qwen2_moe_tiny", Qwen2MoeForCausalLM),
                      ("olmoe_tiny", OlmoeForCausalLM)):
        greedy_generation(os.path.join("moe", name), cls, experts_implementation="eager")


def packed_copies():
    """The saved tiny models again in transformers 5's in-memory layout (packed/: each layer's
    experts as one gate_up_proj [E, 2F, C] and one down_proj [E, C, F], Mixtral's router as
    mlp.gate), in shards of at most 8 kB with their index."""
    for name, cls in (("mixtral_tiny", MixtralForCausalLM), ("qwen2_moe_tiny", Qwen2MoeForCausalLM)):
        folder = os.path.join(OUT, name)
        model = cls.from_pretrained(folder, experts_implementation="eager")
        model.save_pretrained(os.path.join(folder, "packed"), save_original_format=False,
                              max_shard_size="8kB")
        os.remove(os.path.join(folder, "packed", "config.json"))
        os.remove(os.path.join(folder, "packed", "generation_config.json"))


def main():
    os.makedirs(OUT, exist_ok=True)
    gen = torch.Generator().manual_seed(53)
    torch.manual_seed(53)
    blocks(gen)
    models(gen)
    train_steps()
    z_losses()
    generations()
    packed_copies()


if __name__ == "__main__":
    main()
