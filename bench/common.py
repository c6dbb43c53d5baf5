"""Helpers the benchmark scripts share: the CPU's name for the tables, and a benchmark child
script run in the repository's venv whose last stdout line is its JSON result."""
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PYTHON = os.path.join(ROOT, ".venv", "bin", "python")


def cpu_name():
    """The CPU's model name with its family and model numbers (a VM's name can be as short as
    "AMD EPYC") and the matrix-product extensions it has, e.g.
    "AMD EPYC (family 25, model 17; avx512f, avx512_bf16)"."""
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    name = fields.get("Model name", "unknown CPU")
    flags = fields.get("Flags", "").split()
    wanted = ["avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16"]
    have = ", ".join(f for f in wanted if f in flags) or "no AVX2"
    if "CPU family" in fields and "Model" in fields:
        return f"{name} (family {fields['CPU family']}, model {fields['Model']}; {have})"
    return f"{name} ({have})"


def run_child(source, *args):
    """Runs `source` with the venv's python -c, its arguments as strings; returns the JSON object
    it printed last."""
    r = subprocess.run([VENV_PYTHON, "-c", source, *map(str, args)], check=True,
                       capture_output=True, text=True)
    return json.loads(r.stdout.strip().splitlines()[-1])
