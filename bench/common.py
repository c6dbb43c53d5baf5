"""Helpers the benchmark scripts share: the CPU's name for the tables, a benchmark child script
run in the repository's venv whose last stdout line is its JSON result, and the parallel
layouts' plans and runs (tp_plan.py, sp_plan.py)."""
import json
import os
import subprocess
import sys

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


def require_data(*paths, venv=True):
    """Exits naming the first of `paths` that is missing and the script that makes it."""
    for path in paths:
        if not os.path.exists(path):
            sys.exit(f"{path} is missing: run scripts/get_data.sh"
                     + (" (with scripts/setup_python.sh)" if venv else ""))


def run_child(source, *args):
    """Runs `source` with the venv's python -c, its arguments as strings; returns the JSON object
    it printed last."""
    r = subprocess.run([VENV_PYTHON, "-c", source, *map(str, args)], check=True,
                       capture_output=True, text=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


BRISK = os.environ.get("BRISK_BIN", os.path.join(ROOT, "build", "brisk"))
# mpirun as root, without the cross-process memory copies containers often forbid.
MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none")
# The layouts' tables: name, batch, sequence, hidden, heads, layers (GPT-2 124M, Llama 7B's shape).
LAYOUT_SHAPES = [("gpt2", 4, 1024, 768, 12, 12), ("llama-2-7b", 1, 4096, 4096, 32, 32)]


def layout_estimate(flag, degree, model, batch, seq, tmp, extra=()):
    """`brisk estimate --<flag> degree --world_size degree --bf16` (and `extra` arguments)'s
    JSON, or (None, the refusal's last line)."""
    out = os.path.join(tmp, f"{model}_{flag}{degree}{''.join(extra)}.json")
    r = subprocess.run([BRISK, "estimate", "--model_name_or_path", model, f"--{flag}",
                        str(degree), "--world_size", str(degree), "--per_device_train_batch_size",
                        str(batch), "--seq_len", str(seq), "--bf16", "--output_json", out,
                        *extra],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip().splitlines()[-1]
    return json.load(open(out)), None


def layout_train(flag, degree, threads, model, batch, seq, max_steps, out, extra=()):
    """A bf16 run of `degree` ranks (mpirun above 1) with --<flag> degree (and `extra`
    arguments), `threads` each; returns its train_results.json."""
    args = [BRISK, "train", "--model_name_or_path", model, f"--{flag}", str(degree),
            "--per_device_train_batch_size", str(batch), "--seq_len", str(seq),
            "--max_steps", str(max_steps), "--logging_steps", str(max_steps),
            "--output_dir", out, "--disable_tqdm", "--save_strategy", "no", "--bf16",
            "--dataset_size", str(batch * max_steps), *extra]
    env = dict(MPI_ENV, OMP_NUM_THREADS=str(threads))
    if degree > 1:
        args = ["mpirun", "-np", str(degree), "--oversubscribe", "--bind-to", "none"] + args
    subprocess.run(args, check=True, env=env, capture_output=True, text=True)
    return json.load(open(os.path.join(out, "train_results.json")))


def layout_plan_table(flag, name, formula_column, formula, tmp, extra=()):
    """Each rank's plan (layout_estimate, with `extra` arguments) for degrees 1, 2, 4 and 8 of
    --<flag> (`name`: its column), and the activations one block keeps against
    formula(s, b, h, degree), Megatron-LM's per-layer bytes in 16-bit activations."""
    mib = 2**20
    states = ("weights", "master_weights", "gradients", "optimizer_state")
    print(f"| model | {name} | model states / rank | activations / rank | total / rank "
          f"| per block (brisk) | {formula_column} | brisk / Megatron |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for model, b, s, h, _, _ in LAYOUT_SHAPES:
        for degree in (1, 2, 4, 8):
            j, error = layout_estimate(flag, degree, model, b, s, tmp, extra)
            if j is None:
                print(f"| {model} | {degree} | refused: {error} | | | | | |")
                continue
            m = j["memory"]
            planned = m["planned_bytes"]
            held = sum(planned[k] for k in states)
            block = m["activations_per_block_bytes"]
            want = formula(s, b, h, degree)
            print(f"| {model} b{b} s{s} | {degree} | {held / mib:.0f} MiB "
                  f"| {planned['activations'] / mib:.0f} MiB "
                  f"| {m['planned_total_bytes'] / mib:.0f} MiB | {block / mib:.1f} MiB "
                  f"| {want / mib:.1f} MiB | {block / want:.2f} |")

# A child's run_clm data, shared by the causal-LM benchmarks' Python sides: the text's lines (as
# the datasets text loader keeps their line breaks), the 5% held out, and blocks(rows), which
# tokenizes with `tok` and groups per map batch of 1000 rows into blocks of `block` tokens. The
# child defines text, block and tok.
RUN_CLM_BLOCKS = r'''
with open(text, encoding="utf-8") as f:
    lines = f.read().splitlines(keepends=True)  # the datasets text loader, keep_linebreaks
cut = int(round(len(lines) * 5 / 100))
def blocks(rows):  # run_clm: tokenize, then group_texts per map batch of 1000 rows
    ids = tok(rows)["input_ids"]
    out = []
    for first in range(0, len(ids), 1000):
        cat = [t for r in ids[first:first + 1000] for t in r]
        n = len(cat) // block * block
        out += [cat[i:i + block] for i in range(0, n, block)]
    return [{"input_ids": b, "attention_mask": [1] * block, "labels": b} for b in out]
'''
