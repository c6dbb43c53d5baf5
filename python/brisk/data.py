"""Datasets handed to the engine: files as they are, tables in memory as JSON Lines files.

brisk reads text columns and tokenizes them itself (chosen as run_glue, run_clm and run_mlm choose
them). A `datasets.Dataset` and a pandas DataFrame are written by their own vectorized JSON Lines
writers; plain Python columns or records by the json module. The engine's tokenization cache is
keyed by the file's bytes, so the same rows are tokenized once.
"""

import json
import os

_SPLITS = {"train": ("train",), "eval": ("validation", "eval", "valid", "dev"), "test": ("test",)}


def _split_of(dataset_dict, role):
    """The split of a DatasetDict (or a dict of datasets) that serves `role`."""
    names = list(dataset_dict.keys())
    if len(names) == 1:
        return dataset_dict[names[0]]
    for name in _SPLITS[role]:
        if name in dataset_dict:
            return dataset_dict[name]
    raise ValueError("a DatasetDict with splits %s: none is a %s split (%s); pass the split"
                     % (names, role, ", ".join(_SPLITS[role])))


def _is_dataset_dict(data):
    return type(data).__name__ in ("DatasetDict", "IterableDatasetDict") or (
        isinstance(data, dict) and data and all(hasattr(v, "column_names") for v in data.values()))


def _check_columns(columns):
    tokenized = [c for c in ("input_ids",) if c in columns]
    if tokenized:
        raise ValueError(
            "the dataset holds tokenized columns (%s): brisk reads text columns and tokenizes "
            "them itself; pass the dataset before tokenization (its text and label columns)"
            % ", ".join(tokenized))


def _write_records(records, path):
    with open(path, "w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")


def _write_columns(columns, path):
    names = list(columns)
    lengths = {len(columns[n]) for n in names}
    if len(lengths) > 1:
        raise ValueError("columns of different lengths: %s"
                         % ", ".join("%s %d" % (n, len(columns[n])) for n in names))
    _write_records(({n: columns[n][i] for n in names} for i in range(lengths.pop() if names else 0)),
                   path)


def data_file(data, role, folder):
    """A file of `data` the engine reads for `role` (train, eval or test): a path as it is, else
    a JSON Lines file written into `folder`."""
    if data is None:
        return ""
    if isinstance(data, (str, os.PathLike)):
        return os.fspath(data)
    if _is_dataset_dict(data):
        data = _split_of(data, role)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, role + ".jsonl")
    if hasattr(data, "column_names") and hasattr(data, "to_json"):  # datasets.Dataset
        _check_columns(data.column_names)
        data.to_json(path, lines=True, force_ascii=False)
    elif hasattr(data, "columns") and hasattr(data, "to_json"):  # pandas.DataFrame
        _check_columns(list(data.columns))
        data.to_json(path, orient="records", lines=True, force_ascii=False)
    elif isinstance(data, dict):
        _check_columns(list(data))
        _write_columns(data, path)
    elif isinstance(data, (list, tuple)):
        if not all(isinstance(r, (dict, str)) for r in data):
            raise ValueError("a list dataset holds records (dicts) or texts (strings)")
        records = [r if isinstance(r, dict) else {"text": r} for r in data]
        _check_columns({k for r in records for k in r})
        _write_records(records, path)
    else:
        raise TypeError("a dataset is a file path, a datasets.Dataset or DatasetDict, a pandas "
                        "DataFrame, a dict of columns or a list of records, not %s"
                        % type(data).__name__)
    return path
