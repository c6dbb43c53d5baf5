"""Shared fixtures of the Python package's tests: the repository's fixture files, a tiny BERT for
the fixture WordPiece tokenizer, and the brisk program (BRISK_PROGRAM, default build/brisk) the API
is compared with."""

import csv
import json
import os
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
WORDPIECE = os.path.join(FIXTURES, "tokenizer", "wordpiece")
GLUE = os.path.join(FIXTURES, "glue_pandas")

# A tiny BERT for the WordPiece fixture's 1200 tokens, dropout off (tests/trainer_support.h).
TINY_BERT = {"model_type": "bert", "vocab_size": 1200, "hidden_size": 32, "num_hidden_layers": 2,
             "num_attention_heads": 2, "intermediate_size": 48, "max_position_embeddings": 64,
             "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}

# The runs' options: short, on tokenized rows of 16, logging every step.
RUN = {"max_seq_length": 16, "per_device_train_batch_size": 4, "learning_rate": 1e-3,
       "num_train_epochs": 2, "logging_steps": 1, "save_strategy": "no", "seed": 7,
       "disable_tqdm": True, "report_to": "none"}


@pytest.fixture
def program():
    path = os.environ.get("BRISK_PROGRAM", os.path.join(ROOT, "build", "brisk"))
    if not os.access(path, os.X_OK):
        pytest.fail("the brisk program is not built at %s (scripts/build.sh brisk)" % path)
    return path


@pytest.fixture
def bert_config(tmp_path):
    """A config.json of the tiny BERT."""
    path = tmp_path / "model" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(TINY_BERT))
    return str(path)


def read_glue(name):
    """The sentence and label columns of a glue_pandas CSV (its index column left out)."""
    with open(os.path.join(GLUE, name), newline="") as f:
        rows = list(csv.DictReader(f))
    return {"sentence": [r["sentence"] for r in rows], "label": [int(r["label"]) for r in rows]}


def write_csv(columns, path):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        names = list(columns)
        writer.writerow(names)
        for i in range(len(columns[names[0]])):
            writer.writerow([columns[n][i] for n in names])
    return str(path)


def cli_flags(options):
    flags = []
    for key, value in options.items():
        flags += ["--" + key, json.dumps(value) if isinstance(value, bool) else str(value)]
    return flags


def run_cli(program, command, options, *extra):
    """The brisk program's JSON log records (stdout lines that are JSON objects)."""
    done = subprocess.run([program, command] + cli_flags(options) + list(extra),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    records = []
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            records.append(json.loads(line))
    return records


def losses(records):
    return [(r["step"], r["loss"]) for r in records if "loss" in r and "step" in r]
