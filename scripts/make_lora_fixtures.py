#!/usr/bin/env python3
"""Writes the LoRA target fixtures under tests/fixtures/lora/ with transformers + PEFT.

targets.json: for each tiny model of tests/fixtures (its class from config.json's architectures,
PEFT's task type from the class), and for each target_modules value below, the module names PEFT
wraps with a LoRA layer (sorted), or the error PEFT raises. The values: PEFT's default for the
model type (null), lists of transformers' module names, PEFT's "all-linear", and a regular
expression (a string, which PEFT matches against the whole module name). modules_to_save is set
to PEFT's SEQ_CLS default ["classifier", "score"] for classification models, as PEFT's own
configs do.
adapter_config.json: PEFT's save_pretrained of a LoRA of llama_tiny (r 4, alpha 8, dropout 0.05,
q_proj and v_proj), the file a brisk run must read.
merge_<model>/: a LoRA with random A and B (init_lora_weights=False) saved by PEFT
(adapter_config.json, adapter_model.safetensors) and merged.safetensors, the tensors of
merge_and_unload()'s state dict that differ from the base model's: llama_tiny (q_proj, v_proj),
gpt2_tiny (c_attn and c_proj, GPT-2's Conv1D: fan_in_fan_out; use_rslora), bert_tiny (query,
value, and the classifier as a module to save, its copy perturbed as training would);
expected.safetensors: the adapted model's loss and logits on the base fixture's batch (eval mode)
and the gradients of the adapter's tensors (grad.<its key in adapter_model.safetensors>);
generate.json (the causal LMs): PEFT's greedy generate() with the adapter unmerged, 10 tokens
after the base fixture's generate.json prompt.
train_<model>/: TRAIN_STEPS training steps of a LoRA on the base fixture's batch with dropout off
(the model's and lora_dropout), as Trainer + PEFT take them: AdamW (lr 1e-2 constant, weight
decay 0.01 on all but biases and LayerNorm weights), gradients clipped to norm 1. initial/ is the
adapter before (random A and B, PEFT's save_pretrained), final/ after, steps.safetensors the
losses; llama_tiny (q_proj, v_proj), gpt2_tiny (c_attn, Conv1D), bert_tiny (query, value; PEFT
trains the classifier in full as a module to save).

experts_<model>/: LoRA on a mixture's routed experts (experts_fixture), mixtral_tiny and
olmoe_tiny.
listed_<model>/: the experts named by their per-expert linears (listed_fixture).
all_linear_<model>/: all-linear on the three mixtures (all_linear_fixture).

Run:  scripts/setup_python.sh &&
      .venv/bin/python scripts/make_lora_fixtures.py [experts|listed|all_linear]
"""
import json
import os
import re
import tempfile

import transformers
from peft import LoraConfig, TaskType, get_peft_model
from peft.tuners.lora import LoraLayer

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures")
OUT = os.path.join(FIXTURES, "lora")

MODELS = ["bert_tiny", "bert_mlm", "distilbert_tiny", "gpt2_tiny", "llama_tiny", "mistral_tiny",
          "qwen2_tiny", "moe/mixtral_tiny", "moe/olmoe_tiny", "moe/qwen2_moe_tiny"]
TARGETS = [None, ["q_proj", "v_proj"], ["query", "value"], ["q_lin", "v_lin"], ["c_attn"],
           ["c_proj"], ["o_proj", "down_proj", "gate_proj", "up_proj"], ["dense"],
           ["layers.1.self_attn.q_proj"], ["nonexistent"], "all-linear", r".*\.1\..*proj"]


def task_of(cls_name):
    if cls_name.endswith("ForSequenceClassification"):
        return TaskType.SEQ_CLS
    if cls_name.endswith("ForCausalLM") or cls_name.endswith("LMHeadModel"):
        return TaskType.CAUSAL_LM
    return None  # masked LM: PEFT has no task type for it


def wrapped(name, targets):
    config_path = os.path.join(FIXTURES, name)
    config = transformers.AutoConfig.from_pretrained(config_path)
    cls_name = config.architectures[0]
    model = getattr(transformers, cls_name)(config)
    task = task_of(cls_name)
    kwargs = dict(r=4, lora_alpha=8, target_modules=targets, task_type=task)
    if task == TaskType.SEQ_CLS:
        kwargs["modules_to_save"] = ["classifier", "score"]
    try:
        peft_model = get_peft_model(model, LoraConfig(**kwargs))
    except (ValueError, TypeError) as e:
        # PEFT names the targets as a set, in an order that varies from run to run.
        first = re.sub(r"\{([^}]*)\}", lambda m: "{" + ", ".join(sorted(m.group(1).split(", "))) + "}",
                       str(e).split("\n")[0])
        return {"error": first[:200]}
    prefix = "base_model.model."
    names = sorted(n[len(prefix):] if n.startswith(prefix) else n
                   for n, m in peft_model.named_modules() if isinstance(m, LoraLayer))
    return {"wrapped": names}


def adapter_config():
    config = transformers.AutoConfig.from_pretrained(os.path.join(FIXTURES, "llama_tiny"))
    model = transformers.LlamaForCausalLM(config)
    model.name_or_path = "llama_tiny"
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.05, target_modules=["q_proj", "v_proj"],
                      task_type=TaskType.CAUSAL_LM)
    with tempfile.TemporaryDirectory() as d:
        get_peft_model(model, lora).save_pretrained(d)
        with open(os.path.join(d, "adapter_config.json")) as f:
            written = json.load(f)
    # PEFT keeps target_modules as a set: its order in the file varies from run to run.
    written["target_modules"] = sorted(written["target_modules"])
    return written


def save_adapter(peft_model, out, distinct_modules_to_save=True):
    """PEFT's save_pretrained, its set-valued keys sorted (their order varies from run to run);
    modules_to_save also made distinct (PEFT's task models list classifier twice), unless the
    fixture keeps PEFT's list as written."""
    peft_model.save_pretrained(out)
    config_path = os.path.join(out, "adapter_config.json")
    with open(config_path) as f:
        written = json.load(f)
    written["target_modules"] = sorted(written["target_modules"])  # a set in PEFT
    if written.get("target_parameters"):
        written["target_parameters"] = sorted(written["target_parameters"])  # a set too
    if written.get("modules_to_save") and distinct_modules_to_save:
        written["modules_to_save"] = sorted(set(written["modules_to_save"]))
    with open(config_path, "w") as f:
        json.dump(written, f, indent=2, sort_keys=True)
        f.write("\n")
    readme = os.path.join(out, "README.md")
    if os.path.exists(readme):
        os.remove(readme)


MERGES = {
    "llama_tiny": dict(target_modules=["q_proj", "v_proj"], task_type=TaskType.CAUSAL_LM),
    "gpt2_tiny": dict(target_modules=["c_attn", "c_proj"], fan_in_fan_out=True, use_rslora=True,
                      task_type=TaskType.CAUSAL_LM, b_scale=2.0),
    "bert_tiny": dict(target_modules=["query", "value"], modules_to_save=["classifier"],
                      task_type=TaskType.SEQ_CLS),
}


def expected_of(peft_model, batch, out):
    """expected.safetensors: the adapted model's loss and logits on `batch` (eval mode) and the
    gradients of the adapter's tensors (grad.<its key in adapter_model.safetensors>)."""
    from safetensors.torch import save_file
    peft_model.eval()
    result = peft_model(**batch)
    result.loss.backward()
    expected = {"loss": result.loss.detach().reshape(()).float().contiguous(),
                "logits": result.logits.detach().float().contiguous()}
    for n, p in peft_model.named_parameters():
        if p.requires_grad:
            key = n.replace(".default", "").replace(".modules_to_save", "")
            expected["grad." + key] = p.grad.detach().float().contiguous()
    save_file(expected, os.path.join(out, "expected.safetensors"))


def merged_of(peft_model, base, out):
    """merged.safetensors: the tensors of merge_and_unload()'s state dict that differ from
    `base`'s."""
    import torch
    from safetensors.torch import save_file
    merged = peft_model.merge_and_unload().state_dict()
    changed = {k: v.contiguous() for k, v in merged.items()
               if k in base and not torch.equal(v, base[k])}
    save_file(changed, os.path.join(out, "merged.safetensors"))


def merge_fixture(name, kwargs):
    # B's values scaled up for a visible update; GPT-2's less (rsLoRA scales it 4x already, and
    # larger attention scores leave its gradients to float32 rounding at 1e-3).
    kwargs = dict(kwargs)
    b_scale = kwargs.pop("b_scale", 10.0)
    import torch
    torch.manual_seed(0)
    path = os.path.join(FIXTURES, name)
    cls_name = transformers.AutoConfig.from_pretrained(path).architectures[0]
    # eager attention, as scripts/make_fixtures.py computes the base fixtures
    model = getattr(transformers, cls_name).from_pretrained(path, attn_implementation="eager")
    model.name_or_path = name
    base = {k: v.clone() for k, v in model.state_dict().items()}
    lora = LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, **kwargs)
    peft_model = get_peft_model(model, lora)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.mul_(b_scale)
            if "modules_to_save" in n:
                p.add_(0.5 * torch.randn_like(p))
    out = os.path.join(OUT, "merge_" + name.split("_")[0])
    os.makedirs(out, exist_ok=True)
    save_adapter(peft_model, out, distinct_modules_to_save=False)
    from safetensors.torch import load_file
    batch = {k: v.long() for k, v in load_file(os.path.join(path, "batch.safetensors")).items()}
    expected_of(peft_model, batch, out)
    if kwargs.get("task_type") == TaskType.CAUSAL_LM:
        greedy_generation(peft_model, batch, out)
    merged_of(peft_model, base, out)


def greedy_generation(peft_model, batch, out):
    # PEFT's generate() with the adapter unmerged, greedy: the batch's first row's first 5
    # tokens as the prompt (the base fixture's generate.json prompt), 10 new tokens.
    import torch
    prompt = batch["input_ids"][:1, :5]
    with torch.no_grad():
        ids = peft_model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                                  max_new_tokens=10, do_sample=False, pad_token_id=0)
    with open(os.path.join(out, "generate.json"), "w") as f:
        json.dump({"prompt": prompt[0].tolist(), "greedy": ids[0, prompt.shape[1]:].tolist()}, f)
        f.write("\n")


TRAIN_STEPS = 3
TRAINS = {
    "llama_tiny": dict(target_modules=["q_proj", "v_proj"], task_type=TaskType.CAUSAL_LM),
    "gpt2_tiny": dict(target_modules=["c_attn"], fan_in_fan_out=True, task_type=TaskType.CAUSAL_LM),
    "bert_tiny": dict(target_modules=["query", "value"], task_type=TaskType.SEQ_CLS),
}
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, resid_pdrop=0.0,
                  embd_pdrop=0.0, attn_pdrop=0.0, attention_dropout=0.0)


def train_fixture(name, kwargs):
    import torch
    from safetensors.torch import load_file, save_file
    torch.manual_seed(1)
    path = os.path.join(FIXTURES, name)
    config = transformers.AutoConfig.from_pretrained(path)
    for k, v in NO_DROPOUT.items():
        if hasattr(config, k):
            setattr(config, k, v)
    cls = getattr(transformers, config.architectures[0])
    model = cls.from_pretrained(path, config=config, attn_implementation="eager")
    model.name_or_path = name
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, init_lora_weights=False, **kwargs)
    peft_model = get_peft_model(model, lora)
    out = os.path.join(OUT, "train_" + name.split("_")[0])
    save_adapter(peft_model, os.path.join(out, "initial"))
    batch = {k: v.long() for k, v in load_file(os.path.join(path, "batch.safetensors")).items()}
    trained = [(n, p) for n, p in peft_model.named_parameters() if p.requires_grad]
    decayed = [p for n, p in trained if not n.endswith(".bias") and "LayerNorm" not in n]
    kept = [p for n, p in trained if n.endswith(".bias") or "LayerNorm" in n]
    opt = torch.optim.AdamW([{"params": decayed, "weight_decay": 0.01},
                             {"params": kept, "weight_decay": 0.0}],
                            lr=1e-2, betas=(0.9, 0.999), eps=1e-8)
    peft_model.train()
    losses = []
    for _ in range(TRAIN_STEPS):
        loss = peft_model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for _, p in trained], 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    save_adapter(peft_model, os.path.join(out, "final"))
    save_file({"losses": torch.tensor(losses, dtype=torch.float32)},
              os.path.join(out, "steps.safetensors"))


EXPERTS = ["moe/mixtral_tiny", "moe/olmoe_tiny"]


# Each mixture's per-expert linears by transformers 4's names, which PEFT turns into its fused
# experts' target_parameters (gate and up together at twice the rank and alpha).
LISTED = {"moe/mixtral_tiny": ["q_proj", "w1", "w3", "w2"],
          "moe/olmoe_tiny": ["q_proj", "gate_proj", "up_proj", "down_proj"]}


def random_mixture_lora(name, seed, **kwargs):
    """A rank-2 LoRA (alpha 4, no dropout) of mixture `name` with random A and B (B scaled by 10),
    `kwargs` its targets; with the fixture's folder and the base's tensors before it. The experts
    run their loop (eager), as scripts/make_moe_fixtures.py computes the base fixtures."""
    import torch
    torch.manual_seed(seed)
    path = os.path.join(FIXTURES, name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, attn_implementation="eager", experts_implementation="eager")
    model.name_or_path = name
    base = {k: v.clone() for k, v in model.state_dict().items()}
    lora = LoraConfig(r=2, lora_alpha=4, lora_dropout=0.0, init_lora_weights=False,
                      task_type=TaskType.CAUSAL_LM, **kwargs)
    peft_model = get_peft_model(model, lora)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.mul_(10.0)
    return path, base, peft_model


def listed_fixture(name):
    """listed_<model>/: LISTED's target_modules as PEFT converts them for the fused experts
    (rank_pattern and alpha_pattern doubling gate_up_proj's), random A and B, saved by PEFT with
    expected.safetensors."""
    from safetensors.torch import load_file
    path, _, peft_model = random_mixture_lora(name, 3, target_modules=LISTED[name])
    out = os.path.join(OUT, "listed_" + name.split("/")[-1].split("_")[0])
    os.makedirs(out, exist_ok=True)
    save_adapter(peft_model, out)
    batch = {k: v.long() for k, v in load_file(os.path.join(path, "batch.safetensors")).items()}
    expected_of(peft_model, batch, out)


ALL_LINEAR = ["moe/mixtral_tiny", "moe/olmoe_tiny", "moe/qwen2_moe_tiny"]


def all_linear_fixture(name):
    """all_linear_<model>/: target_modules "all-linear" as PEFT resolves it on a mixture: on
    Mixtral and OLMoE the attention's linears, the router (gate.weight) and the experts as
    target_parameters (gate_up_proj at twice the rank and alpha); on Qwen2-MoE the attention's,
    the shared expert's and its gate's linears and the dense layers' MLP. Random A and B, saved
    by PEFT with expected.safetensors (computed in float64) and merged.safetensors."""
    from safetensors.torch import load_file
    path, base, peft_model = random_mixture_lora(name, 4, target_modules="all-linear")
    out = os.path.join(OUT, "all_linear_" + name.split("/")[-1][:-len("_tiny")])
    os.makedirs(out, exist_ok=True)
    save_adapter(peft_model, out)
    batch = {k: v.long() for k, v in load_file(os.path.join(path, "batch.safetensors")).items()}
    # In float64: the tiny Mixtral's gradients are ill-conditioned (PEFT's own float32 ones differ
    # from these by up to 4e-4), so the reference is the exact one.
    import copy
    expected_of(copy.deepcopy(peft_model).double(), batch, out)
    merged_of(peft_model, base, out)


def experts_fixture(name):
    """experts_<model>/: a LoRA of the routed experts' fused weights (PEFT's target_parameters:
    mlp.experts.gate_up_proj and mlp.experts.down_proj, each expert its own rank-2 A and B) and of
    q_proj, with random A and B, saved by PEFT; expected.safetensors, generate.json and
    merged.safetensors as merge_fixture writes them."""
    from safetensors.torch import load_file
    path, base, peft_model = random_mixture_lora(
        name, 2, target_modules=["q_proj"],
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    out = os.path.join(OUT, "experts_" + name.split("/")[-1].split("_")[0])
    os.makedirs(out, exist_ok=True)
    save_adapter(peft_model, out)
    batch = {k: v.long() for k, v in load_file(os.path.join(path, "batch.safetensors")).items()}
    expected_of(peft_model, batch, out)
    greedy_generation(peft_model, batch, out)
    merged_of(peft_model, base, out)


def main():
    import sys
    if sys.argv[1:] == ["experts"]:
        for name in EXPERTS:
            experts_fixture(name)
        return
    if sys.argv[1:] == ["all_linear"]:
        for name in ALL_LINEAR:
            all_linear_fixture(name)
        return
    if sys.argv[1:] == ["listed"]:
        for name in LISTED:
            listed_fixture(name)
        return
    os.makedirs(OUT, exist_ok=True)
    cases = []
    for name in MODELS:
        for targets in TARGETS:
            case = {"model": name, "target_modules": targets}
            case.update(wrapped(name, targets))
            cases.append(case)
    with open(os.path.join(OUT, "targets.json"), "w") as f:
        json.dump({"peft": __import__("peft").__version__,
                   "transformers": transformers.__version__, "cases": cases}, f, indent=1)
        f.write("\n")
    with open(os.path.join(OUT, "adapter_config.json"), "w") as f:
        json.dump(adapter_config(), f, indent=2, sort_keys=True)
        f.write("\n")
    for name, kwargs in MERGES.items():
        merge_fixture(name, kwargs)
    for name, kwargs in TRAINS.items():
        train_fixture(name, kwargs)
    for name in EXPERTS:
        experts_fixture(name)


if __name__ == "__main__":
    main()
