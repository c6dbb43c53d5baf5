#!/usr/bin/env python3
"""Writes tests/fixtures/qlora/quant4.safetensors with bitsandbytes: 4-bit quantization of stored
vectors, the reference brisk's must reproduce bit for bit.

For each case <name> (an input of float32 or bf16 values, its length a multiple of the block or
not), bitsandbytes.functional.quantize_4bit(A, blocksize, quant_type, compress_statistics) on the
CPU and dequantize_4bit of the result:
  <name>.input        the values quantized (their own dtype)
  <name>.packed       uint8, two codes a byte (the first in the high nibble)
  <name>.absmax       float32, one per block (compress_statistics: absent)
  <name>.qabsmax      uint8, the absmaxes less their mean, 8-bit in blocks of 256 (nested)
  <name>.absmax2      float32, one per 256 absmaxes (nested)
  <name>.offset       float32 [1], the absmaxes' mean (nested)
  <name>.f32, .bf16   dequantize_4bit's output in float32 and in bf16
  <name>.meta         int64 [blocksize, nf4 (1) or fp4 (0), nested (1/0)]
code.nf4, code.fp4: the 16 values of each 4-bit type, as bitsandbytes lists them; code.dynamic:
the 256 values of the signed dynamic map the nested absmaxes are stored with.

Saved 4-bit models, as transformers' save_pretrained writes a model loaded with a
BitsAndBytesConfig (the packed codes under the weight's name, its quantization state beside it):
llama_nf4/ (llama_tiny, NF4 with nested quantization, float32) and gpt2_fp4/ (gpt2_tiny, FP4,
bf16: GPT-2's Conv1D weights). Each folder's expected.safetensors holds every 4-bit weight as
bitsandbytes dequantizes it (under its name, in the model's layout, widened to float32), and the
loss and logits of the model with those weights (its other tensors as saved) on the base
fixture's batch, in float32.

Run:  scripts/setup_python.sh && .venv/bin/python scripts/make_qlora_fixtures.py
"""
import os

import bitsandbytes.functional as F
import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "qlora")

# name: (length, dtype, blocksize, quant_type, nested, scale)
CASES = {
    "nf4_f32": (1024, torch.float32, 64, "nf4", False, 0.02),
    "nf4_f32_tail": (1000, torch.float32, 64, "nf4", False, 1.0),
    "nf4_bf16_nested": (64 * 260, torch.bfloat16, 64, "nf4", True, 0.05),
    "nf4_f32_nested_tail": (64 * 257 + 10, torch.float32, 64, "nf4", True, 3.0),
    "fp4_f32": (1024, torch.float32, 64, "fp4", False, 0.02),
    "fp4_bf16_nested": (64 * 258, torch.bfloat16, 64, "fp4", True, 0.5),
    "nf4_f32_block128": (1024, torch.float32, 128, "nf4", False, 0.1),
}


def case(gen, name, length, dtype, blocksize, quant_type, nested, scale):
    x = (torch.randn(length, generator=gen) * scale)
    # Some blocks of one repeated value and an exact zero block's neighbour: the edges of the
    # rounding (values on a code's midpoint, a block's max itself).
    x[:64] = scale
    x[64:128] = 0.0
    x[128] = 0.0
    x = x.to(dtype)
    packed, state = F.quantize_4bit(x, blocksize=blocksize, quant_type=quant_type,
                                    compress_statistics=nested)
    out = {name + ".input": x.contiguous(), name + ".packed": packed.reshape(-1).contiguous()}
    if nested:
        out[name + ".qabsmax"] = state.absmax.contiguous()
        out[name + ".absmax2"] = state.state2.absmax.contiguous()
        out[name + ".offset"] = state.offset.reshape(1).float().contiguous()
    else:
        out[name + ".absmax"] = state.absmax.contiguous()
    state.dtype = torch.float32
    out[name + ".f32"] = F.dequantize_4bit(packed, state).contiguous()
    state.dtype = torch.bfloat16
    out[name + ".bf16"] = F.dequantize_4bit(packed, state).contiguous()
    out[name + ".meta"] = torch.tensor([blocksize, quant_type == "nf4", nested], dtype=torch.int64)
    return out


def saved_model(base, out_name, quant_type, nested, dtype):
    import transformers
    from safetensors.torch import load_file
    config = transformers.BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type=quant_type, bnb_4bit_use_double_quant=nested,
        bnb_4bit_compute_dtype=torch.float32)
    path = os.path.join(HERE, "..", "tests", "fixtures", base)
    cls = getattr(transformers, transformers.AutoConfig.from_pretrained(path).architectures[0])
    model = cls.from_pretrained(path, quantization_config=config, device_map="cpu", dtype=dtype,
                                attn_implementation="eager").eval()
    out = os.path.join(OUT, out_name)
    model.save_pretrained(out)
    expected = {}
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if weight is not None and getattr(weight, "quant_state", None) is not None:
            w = F.dequantize_4bit(weight.data, weight.quant_state).float()
            if type(module).__name__ == "Linear4bit" and "c_" in name.split(".")[-1]:
                w = w.t()  # GPT-2's Conv1D: transformers' layout [in, out]
            expected[name + ".weight"] = w.contiguous()
    # The 4-bit model's forward as float32 products of the dequantized weights (what its CPU
    # products compute in the float32 compute dtype), on a float32 copy of the model.
    reference = cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    state = reference.state_dict()
    for name, value in model.state_dict().items():
        if name in state and value.shape == state[name].shape and value.is_floating_point():
            state[name] = value.float()
    for name, value in expected.items():
        state[name] = value
    reference.load_state_dict(state)
    batch = {k: v.long() for k, v in load_file(os.path.join(path, "batch.safetensors")).items()}
    with torch.no_grad():
        result = reference(**batch)
    expected["loss"] = result.loss.float().reshape(()).contiguous()
    expected["logits"] = result.logits.float().contiguous()
    save_file(expected, os.path.join(out, "expected.safetensors"))


def main():
    os.makedirs(OUT, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    tensors = {"code.nf4": F.get_4bit_type("nf4", device="cpu").float().contiguous(),
               "code.fp4": F.get_4bit_type("fp4", device="cpu").float().contiguous(),
               "code.dynamic": F.create_dynamic_map().float().contiguous()}
    for name, spec in CASES.items():
        tensors.update(case(gen, name, *spec))
    save_file(tensors, os.path.join(OUT, "quant4.safetensors"))
    saved_model("llama_tiny", "llama_nf4", "nf4", True, torch.float32)
    saved_model("gpt2_tiny", "gpt2_fp4", "fp4", False, torch.bfloat16)


if __name__ == "__main__":
    main()
