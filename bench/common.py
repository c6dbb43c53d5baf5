"""Helpers the benchmark scripts share: the CPU's name for the tables, and a benchmark child
script run in the repository's venv whose last stdout line is its JSON result."""
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PYTHON = os.path.join(ROOT, ".venv", "bin", "python")


def cpu_name():
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("Model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def run_child(source, *args):
    """Runs `source` with the venv's python -c, its arguments as strings; returns the JSON object
    it printed last."""
    r = subprocess.run([VENV_PYTHON, "-c", source, *map(str, args)], check=True,
                       capture_output=True, text=True)
    return json.loads(r.stdout.strip().splitlines()[-1])
