"""`brisk tokenize` and `brisk generate` as functions."""

import json
import os

from . import _brisk


def tokenize(tokenizer, texts, add_special_tokens=True, pair_separator=""):
    """The ids of each text (one text or a list), as transformers' tokenizer(text)["input_ids"].
    tokenizer: a model folder, tokenizer.json, tokenizer.model, vocab.txt or vocab.json."""
    one = isinstance(texts, str)
    ids = _brisk.tokenize(os.fspath(tokenizer), [texts] if one else list(texts),
                          add_special_tokens, pair_separator)
    return ids[0] if one else ids


def generate(model, prompt, max_new_tokens=20, do_sample=False, temperature=1.0, top_k=50,
             top_p=1.0, seed=42, device="auto"):
    """Continues `prompt` with the causal LM in folder `model`: a dict with the text (prompt and
    continuation), prompt_ids, new_ids, seconds, planned_bytes and stopped_at_eos."""
    if not isinstance(prompt, str):
        raise TypeError("prompt must be a str, not %s" % type(prompt).__name__)
    for name, value in (("max_new_tokens", max_new_tokens), ("top_k", top_k), ("seed", seed)):
        if int(value) < 0 or int(value) >= 2**63:
            raise ValueError("%s must be a whole number from 0 to 2**63 - 1, got %r"
                             % (name, value))
    options = {"model": os.fspath(model), "prompt": prompt, "max_new_tokens": int(max_new_tokens),
               "do_sample": bool(do_sample), "temperature": float(temperature),
               "top_k": int(top_k), "top_p": float(top_p), "seed": int(seed), "device": device}
    return json.loads(_brisk.generate(json.dumps(options)))
