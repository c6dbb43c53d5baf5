"""`brisk tokenize` and `brisk generate` as functions."""

import json

from . import _brisk, checks


def tokenize(tokenizer, texts, add_special_tokens=True, pair_separator=""):
    """The ids of each text (one text or a list), as transformers' tokenizer(text)["input_ids"].
    tokenizer: a model folder, tokenizer.json, tokenizer.model, vocab.txt or vocab.json."""
    one = isinstance(texts, str)
    ids = _brisk.tokenize(checks.path(tokenizer, "tokenizer"), [texts] if one else _texts(texts),
                          checks.switch(add_special_tokens, "add_special_tokens"),
                          checks.text(pair_separator, "pair_separator"))
    return ids[0] if one else ids


def _texts(texts):
    """`texts` as a list of str: a list, tuple or other iterable of them (not bytes or a dict)."""
    if isinstance(texts, (bytes, dict)) or not hasattr(texts, "__iter__"):
        raise TypeError("texts must be a str or a list of str, not %s" % type(texts).__name__)
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError("texts[%d] must be a str, not %s" % (i, type(text).__name__))
    return texts


def generate(model, prompt, max_new_tokens=20, do_sample=False, temperature=1.0, top_k=50,
             top_p=1.0, seed=42, device="auto", adapter_name_or_path=None):
    """Continues `prompt` with the causal LM in folder `model` (with the LoRA adapter folder
    `adapter_name_or_path` merged into it, if given): a dict with the text (prompt and
    continuation), prompt_ids, new_ids, seconds, planned_bytes and stopped_at_eos."""
    options = {"model": checks.path(model, "model"), "prompt": checks.text(prompt, "prompt"),
               "max_new_tokens": checks.whole(max_new_tokens, "max_new_tokens"),
               "do_sample": checks.switch(do_sample, "do_sample"),
               "temperature": checks.real(temperature, "temperature"),
               "top_k": checks.whole(top_k, "top_k"), "top_p": checks.real(top_p, "top_p"),
               "seed": checks.whole(seed, "seed"), "device": checks.text(device, "device")}
    if adapter_name_or_path is not None:
        options["adapter"] = checks.path(adapter_name_or_path, "adapter_name_or_path")
    return json.loads(_brisk.generate(checks.dumps(options)))
