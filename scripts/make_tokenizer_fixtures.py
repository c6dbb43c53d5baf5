"""Tokenizer fixtures: small vocabularies trained with the `tokenizers` library, the texts, and
the ids the library gives for them (singles, pairs, truncation), for tests/test_tokenizer.cpp.

  python scripts/make_tokenizer_fixtures.py [--retrain]
  (pip install tokenizers sentencepiece transformers; data/kjv from get_data.sh)

SentencePiece tokenizer.model files (BPE with byte fallback as Llama's, and unigram with the
default NFKC normalizer) are trained by the `sentencepiece` library on a small committed text
(sentencepiece_corpus.txt); their ids come from that library, with the template transformers'
LlamaTokenizer applies (<s> first, no </s>).

Training is not deterministic (ties), so a vocabulary already under tests/fixtures is loaded, not
trained again, unless --retrain: the expectations are then recomputed for the same vocabularies.
"""
import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tokenizers import AddedToken, Regex

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizer")

HARD = [
    "Hello, world! This is a TEST of the tokenizer.",
    "café naïve résumé Ünïcödé Ångström façade",
    "你好世界 日本語のテキスト 한국어 텍스트",
    "emoji 😀🎉👍🏽 and symbols ©®™ ∑∫√",
    "[MASK] is [SEP] fine, <|endoftext|> too",
    "\ttabs\t\tand    runs   of     spaces  ",
    "control\x01chars\x7fand\u200bzero\u200dwidth\ufeffmarks",
    "",
    "   ",
    "supercalifragilisticexpialidocious " + "x" * 120,
    "I'll we've they're DON'T it's",
    "numbers 12345 3.14159 1,000,000 and 007",
    "line\u2028separator\u00a0nbsp\u3000ideographic space",
    "Straße ß İstanbul ǅ ﬁ ligature",
    "a-b_c/d\\e|f~g`h^i",
]

# Texts added after the first vocabularies were trained: every tokenizer is checked on them, only
# the Llama-3-style one is trained on them (so the older vocabularies stay as they were).
MORE = [
    "windows\r\nline\r\n\r\nends and\nunix\n\n  lines\n",
    "digits 1234567 and 12,345,678.90 in groups; YOU'LL SHE'S We'Re",
    "  leading and trailing spaces   \t",
    "mixed😀emoji🎉inside词语words",
    "<|begin_of_text|>special<|end_of_text|> in the middle",
]

# Numbers next to spaces, letters and symbols, in several scripts and numeric categories: checked
# only for bpe_digits (Digits(individual_digits) before ByteLevel, as SmolLM2's tokenizer.json).
DIGIT_TEXTS = ["Call 555 1234 now", "  12  ab3c  9", "x\t 7\n 8", "\u0663\u0664 \u0665 and \u06f1\u06f2",
               "\u216b chapters \u00bd cup x\u00b2", "it's1 they'll22 '7", "a  \n 9 end 10   ",
               "3.14, 1,000 and -5e10", "\u00a0 4\u3000 5", "1 2  3   4"]

# Texts with the SentencePiece-style special tokens, checked only for the Unigram and
# SentencePiece fixtures (texts.json also feeds other tests' training data, so it stays as it is).
SPECIAL = ["</s>after an end </s> and <unk> </s>", "<s> begins, ends </s>"]

# Llama-3's pre-tokenizer regex (a Split before a ByteLevel without its own regex).
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


SP_CORPUS = os.path.join(OUT, "sentencepiece_corpus.txt")
SP_RULES = "/tmp/brisk_sentencepiece_rules.tsv"


def kjv_lines(n):
    path = os.path.join(ROOT, "data", "kjv", "kjv.txt")
    with open(path, encoding="utf-8") as f:
        lines = [l.rstrip("\n") for l in f if l.strip()]
    return lines[:: max(1, len(lines) // n)][:n]


def wordpiece(lowercase):
    t = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    t.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                              strip_accents=None, lowercase=lowercase)
    t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return t


def longest_first(a, b, budget):
    """The tokenizers library's longest_first truncation of a pair to `budget` ids."""
    if len(a) + len(b) <= budget:
        return a, b
    if len(a) > len(b):
        kb = min(len(b), budget // 2)
        ka = budget - kb
    else:
        ka = min(len(a), budget // 2)
        kb = budget - ka
    return a[:ka], b[:kb]


def sentencepiece_fixtures(texts):
    """tokenizer.model files trained by the sentencepiece library, and the ids it gives."""
    import sentencepiece as spm
    if not os.path.exists(SP_CORPUS):
        with open(SP_CORPUS, "w", encoding="utf-8") as f:
            for line in kjv_lines(500) + HARD * 3 + MORE * 3:
                f.write(line.replace("\r", " ").replace("\n", " ") + "\n")
    with open(SP_RULES, "w") as f:  # code points -> code points: ligatures, odd spaces
        f.write("FB01\t66 69\nA0\t20\n3000\t20\n2028\t20\nC5\t41 30A\n")
    kinds = {
        # Llama's settings: no normalization, spaces kept, <0xNN> pieces for rare characters.
        "sentencepiece_bpe": dict(model_type="bpe", vocab_size=500, byte_fallback=True,
                                  normalization_rule_name="identity",
                                  remove_extra_whitespaces=False, character_coverage=0.995),
        # Whitespace runs squeezed (the library's default), <unk> for rare characters, and a
        # small normalization table of our own (NFKC's would weigh 240 KB).
        "sentencepiece_unigram": dict(model_type="unigram", vocab_size=300,
                                      character_coverage=0.995, normalization_rule_tsv=SP_RULES),
    }
    for name, options in kinds.items():
        folder = os.path.join(OUT, name)
        os.makedirs(folder, exist_ok=True)
        model = os.path.join(folder, "tokenizer.model")
        if "--retrain" in sys.argv or not os.path.exists(model):
            spm.SentencePieceTrainer.train(input=SP_CORPUS, model_prefix=os.path.join(folder, "tokenizer"),
                                           num_threads=1, minloglevel=2, **options)
            os.remove(os.path.join(folder, "tokenizer.vocab"))
        sp = spm.SentencePieceProcessor(model_file=model)
        bos = [sp.bos_id()]
        special = {sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()}  # decode skips them
        expected = {"single": [], "plain": [], "pairs": [], "decoded": []}
        for text in texts:
            ids = sentencepiece_ids(sp, text)
            expected["plain"].append(ids)
            expected["single"].append(bos + ids)
            expected["decoded"].append(sp.decode([i for i in ids if i not in special]))
        for a, b in zip(texts, texts[1:]):
            ia, ib = longest_first(sentencepiece_ids(sp, a), sentencepiece_ids(sp, b), 16 - 2)
            expected["pairs"].append({"ids": bos + ia + bos + ib,
                                      "type_ids": [0] * (1 + len(ia)) + [1] * (1 + len(ib))})
        expected["special"] = [[x, sentencepiece_ids(sp, x)] for x in SPECIAL]
        with open(os.path.join(folder, "expected.json"), "w", encoding="utf-8") as f:
            json.dump(expected, f, ensure_ascii=False)
        compare_with_transformers(folder, texts, expected)


def sentencepiece_ids(sp, text):
    """The library's ids of the stretches between special pieces (matched first, longest first,
    as transformers' added tokens), the special pieces' ids between them."""
    specials = sorted({sp.id_to_piece(i) for i in (sp.unk_id(), sp.bos_id(), sp.eos_id(),
                                                      sp.pad_id()) if i >= 0}, key=len, reverse=True)
    ids, start, at = [], 0, 0
    while at < len(text):
        hit = next((p for p in specials if text.startswith(p, at)), None)
        if hit is None:
            at += 1
            continue
        if at > start:
            ids += sp.encode(text[start:at])
        ids.append(sp.piece_to_id(hit))
        at += len(hit)
        start = at
    if start < len(text):
        ids += sp.encode(text[start:])
    return ids


def compare_with_transformers(folder, texts, expected):
    """Says where transformers' LlamaTokenizer (from the tokenizer.model alone) agrees."""
    try:
        from transformers import AutoTokenizer, LlamaTokenizer
        t = LlamaTokenizer.from_pretrained(folder)
    except Exception as e:  # transformers missing, or it cannot convert this model
        print(folder, ": transformers not compared:", e)
        return
    same = sum(t(x, add_special_tokens=False)["input_ids"] == want
               for x, want in zip(texts, expected["plain"]))
    print(folder, ": transformers' LlamaTokenizer gives the same ids (special tokens aside) on",
          same, "of", len(texts), "texts")


def main():
    corpus = kjv_lines(3000) + HARD * 3
    texts = kjv_lines(40) + HARD
    made = {}
    for name, lowercase in (("wordpiece", True), ("wordpiece_cased", False)):
        t = wordpiece(lowercase)
        t.train_from_iterator(corpus, trainers.WordPieceTrainer(
            vocab_size=1200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
        cls, sep = t.token_to_id("[CLS]"), t.token_to_id("[SEP]")
        t.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
        t.decoder = decoders.WordPiece()
        made[name] = t
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=800, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    made["bpe"] = bpe
    # The same vocabulary behind Digits(individual_digits) + ByteLevel with its regex (SmolLM2).
    kept_bpe = os.path.join(OUT, "bpe", "tokenizer.json")
    digits = json.loads(Tokenizer.from_file(kept_bpe).to_str() if os.path.exists(kept_bpe)
                        else bpe.to_str())
    digits["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": True}]}
    made["bpe_digits"] = Tokenizer.from_str(json.dumps(digits))

    llama = Tokenizer(models.BPE(ignore_merges=True))
    llama.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    llama.decoder = decoders.ByteLevel()
    llama.train_from_iterator(corpus + MORE * 3, trainers.BpeTrainer(
        vocab_size=900, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos = llama.token_to_id("<|begin_of_text|>")
    llama.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
        special_tokens=[("<|begin_of_text|>", bos)])
    assert json.loads(llama.to_str())["model"]["ignore_merges"]
    made["bpe_llama3"] = llama
    # The same vocabulary split on a pattern that leaves text between its matches: the Isolated
    # behaviour keeps those stretches as pieces too.
    gaps = json.loads(llama.to_str())
    gaps["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\p{L}+|\p{N}"
    made["bpe_split_gaps"] = Tokenizer.from_str(json.dumps(gaps))

    # Llama-2's layout: "▁" for spaces and in front, no pre-tokenizer, <0xNN> byte tokens for
    # characters the vocabulary lacks. <0xF0> is left out, so four-byte characters (emoji) fall
    # back to <unk>, consecutive ones fused.
    fb = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    fb.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                          normalizers.Replace(" ", "\u2581")])
    fb.train_from_iterator(corpus + MORE * 3, trainers.BpeTrainer(
        vocab_size=700, limit_alphabet=60, special_tokens=["<unk>", "<s>", "</s>"]))
    spec = json.loads(fb.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):
        if b != 0xF0:
            vocab.setdefault("<0x%02X>" % b, len(vocab))
    fb = Tokenizer.from_str(json.dumps(spec))
    fb.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s>:1 $B:1", special_tokens=[("<s>", fb.token_to_id("<s>"))])
    fb.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                    decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    made["bpe_byte_fallback"] = fb
    texts = texts + MORE

    # Unigram with the Metaspace pre-tokenizer and decoder (T5/ALBERT-style tokenizer.json).
    uni = Tokenizer(models.Unigram())
    uni.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always",
                                                 split=True)
    uni.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    uni.train_from_iterator(corpus + MORE * 3, trainers.UnigramTrainer(
        vocab_size=400, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>",
        max_piece_length=8))
    # Pieces with CJK characters or emoji left out, so those are unknown (or bytes, below).
    spec = json.loads(uni.to_str())
    spec["model"]["vocab"] = [[p, s] for p, s in spec["model"]["vocab"]
                              if not any(ord(c) >= 0x3000 for c in p)]
    uni = Tokenizer.from_str(json.dumps(spec))
    uni.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B:1 </s>:1",
        special_tokens=[("</s>", uni.token_to_id("</s>"))])
    made["unigram"] = uni
    # The same vocabulary with <0xNN> byte tokens (but <0xF0>: emoji stay <unk>), byte_fallback,
    # Metaspace prepending only in front of the text and not splitting, Llama-style decoders.
    spec = json.loads(uni.to_str())
    spec["model"]["byte_fallback"] = True
    have = {p for p, _ in spec["model"]["vocab"]}
    for b in range(256):
        if b != 0xF0 and "<0x%02X>" % b not in have:
            spec["model"]["vocab"].append(["<0x%02X>" % b, -20.0])
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581",
                             "prepend_scheme": "first", "split": False}
    ub = Tokenizer.from_str(json.dumps(spec))
    ub.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                    decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    made["unigram_byte_fallback"] = ub
    # WhitespaceSplit before Metaspace (as older ALBERT/T5 conversions), prepend_scheme first.
    spec = json.loads(uni.to_str())
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "WhitespaceSplit"},
        {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}]}
    made["unigram_whitespace"] = Tokenizer.from_str(json.dumps(spec))

    for name, t in made.items():
        folder = os.path.join(OUT, name)
        kept = os.path.join(folder, "tokenizer.json")
        if "--retrain" not in sys.argv and os.path.exists(kept):
            t = Tokenizer.from_file(kept)
        os.makedirs(folder, exist_ok=True)
        t.save(os.path.join(folder, "tokenizer.json"))
        # The legacy files of the same vocabulary.
        if name.startswith("wordpiece"):
            vocab = t.get_vocab()
            with open(os.path.join(folder, "vocab.txt"), "w", encoding="utf-8") as f:
                for token, _ in sorted(vocab.items(), key=lambda kv: kv[1]):
                    f.write(token + "\n")
            with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
                json.dump({"do_lower_case": name == "wordpiece"}, f)
        elif name == "bpe":
            t.model.save(folder)  # vocab.json, merges.txt
        expected = {"single": [], "plain": [], "pairs": [], "decoded": []}
        for text in texts:
            expected["single"].append(t.encode(text).ids)
            expected["plain"].append(t.encode(text, add_special_tokens=False).ids)
        t.enable_truncation(max_length=16)
        for a, b in zip(texts, texts[1:]):
            e = t.encode(a, b)
            expected["pairs"].append({"ids": e.ids, "type_ids": e.type_ids})
        t.no_truncation()
        if name.startswith("unigram"):
            expected["special"] = [[x, t.encode(x, add_special_tokens=False).ids] for x in SPECIAL]
        if name == "bpe_digits":
            expected["extra"] = [[x, t.encode(x, add_special_tokens=False).ids]
                                 for x in DIGIT_TEXTS]
        if name.startswith("bpe") or name.startswith("unigram"):
            expected["decoded"] = [t.decode(t.encode(x).ids) for x in texts]
        with open(os.path.join(folder, "expected.json"), "w", encoding="utf-8") as f:
            json.dump(expected, f, ensure_ascii=False)
    sentencepiece_fixtures(texts)
    with open(os.path.join(OUT, "texts.json"), "w", encoding="utf-8") as f:
        json.dump(texts, f, ensure_ascii=False, indent=0)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
