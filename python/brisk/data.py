"""Datasets handed to the engine: files as they are, text tables in memory as JSON Lines files,
tokenized tables as arrays the engine reads where they lie.

Text columns brisk tokenizes itself (chosen as run_glue, run_clm and run_mlm choose them): a
`datasets.Dataset` and a pandas DataFrame are written by their own vectorized JSON Lines writers,
plain Python columns or records by the json module; the engine's tokenization cache is keyed by
the file's bytes, so the same rows are tokenized once. A table with an `input_ids` column is
already tokenized: a Dataset's Arrow buffers are viewed as NumPy arrays without a copy (when their
ids are int32), other tables' lists are joined into one array each.
"""

import itertools
import json
import os

import numpy as np

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


def _is_tokenized(data):
    if hasattr(data, "column_names"):
        return "input_ids" in data.column_names
    if hasattr(data, "columns"):
        return "input_ids" in list(data.columns)
    if isinstance(data, dict):
        return "input_ids" in data
    if isinstance(data, (list, tuple)) and data and isinstance(data[0], dict):
        return "input_ids" in data[0]
    return False


def _int32(values, what):
    """`values` as int32, viewed when they are int32 already, refused when one does not fit."""
    values = np.ascontiguousarray(values)  # (a view where it is contiguous already)
    if values.dtype == np.int32:
        return values
    if values.dtype.kind not in "iu":
        raise ValueError("%s: whole numbers expected, got %s" % (what, values.dtype))
    if values.size and (values.min() < -2**31 or values.max() >= 2**31):
        raise ValueError("%s: a value outside int32" % what)
    return values.astype(np.int32)


def _arrow_lists(table, name):
    """Offsets (int64) and values of list column `name` of an Arrow table, without a copy of the
    values where the column is one chunk."""
    column = table.column(name)
    # (combine_chunks copies even a single chunk.)
    column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    if column.null_count:
        raise ValueError("column %s holds missing rows" % name)
    offsets = np.asarray(column.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    return offsets, column.values.to_numpy(zero_copy_only=False)


def _python_lists(rows, name):
    rows = list(rows)
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64,
                         count=int(offsets[-1]))
    return offsets, values


def _columns_of(data):
    """(get(name) -> (offsets, values) of a list column, get_scalar(name) -> array, names)."""
    if hasattr(data, "column_names") and hasattr(data, "with_format"):  # datasets.Dataset
        # Its Arrow table itself, unless rows were selected or shuffled (an indices mapping):
        # then a table of those rows.
        table = (data.data.table if getattr(data, "_indices", None) is None
                 else data.with_format("arrow")[:])
        return (lambda n: _arrow_lists(table, n),
                lambda n: table.column(n).to_numpy(), list(table.column_names))
    if hasattr(data, "columns") and hasattr(data, "to_numpy"):  # pandas.DataFrame
        return (lambda n: _python_lists(data[n], n), lambda n: data[n].to_numpy(),
                list(data.columns))
    if isinstance(data, (list, tuple)):
        data = {k: [r.get(k) for r in data] for k in data[0]}
    return (lambda n: _python_lists(data[n], n), lambda n: np.asarray(data[n]), list(data))


def _labels(get_scalar, get_lists, names, ids_offsets, ids):
    """The split's labels: a class id (int32) or number (float32) per row; per-token labels (a
    causal LM's) only where they are the inputs, which a causal LM learns from anyway."""
    name = "labels" if "labels" in names else "label" if "label" in names else None
    if name is None:
        return {}
    try:
        offsets, values = get_lists(name)
    except (AttributeError, TypeError, KeyError, ValueError):  # a label per row, not a list
        offsets = None
    if offsets is not None:
        if not (np.array_equal(offsets, ids_offsets) and np.array_equal(values, ids)):
            raise ValueError("per-token labels other than the inputs (a causal LM learns "
                             "from its inputs): brisk reads no others yet")
        return {}
    labels = np.asarray(get_scalar(name))
    if labels.dtype.kind == "f":
        return {"values": np.ascontiguousarray(labels, dtype=np.float32)}
    return {"labels": _int32(labels, "column " + name)}


def _rows(get_lists, name):
    """List column `name` as zero-based offsets and the values they index (a view)."""
    offsets, values = get_lists(name)
    zero_based = np.ascontiguousarray(offsets - offsets[0], dtype=np.int64)
    return zero_based, values[offsets[0]:offsets[-1]]


def tokenized_split(data):
    """A tokenized table's arrays as the engine views them: offsets (int64), ids (int32), types
    (int32, where token_type_ids is given), labels (int32) or values (float32)."""
    get_lists, get_scalar, names = _columns_of(data)
    offsets, ids = _rows(get_lists, "input_ids")
    split = {"offsets": offsets, "ids": _int32(ids, "input_ids")}
    if "attention_mask" in names and not np.all(_rows(get_lists, "attention_mask")[1]):
        raise ValueError("padded rows (zeros in attention_mask): tokenize without padding, "
                         "brisk pads each batch itself")
    if "token_type_ids" in names:
        type_offsets, types = _rows(get_lists, "token_type_ids")
        if not np.array_equal(type_offsets, offsets):
            raise ValueError("token_type_ids and input_ids differ in length")
        split["types"] = _int32(types, "token_type_ids")
    split.update(_labels(get_scalar, lambda n: _rows(get_lists, n), names, offsets, ids))
    return split


def _check_columns(columns):
    if "input_ids" in columns:
        raise ValueError("internal: a tokenized table reached the text writer")


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
    rows = lengths.pop() if names else 0
    _write_records(({n: columns[n][i] for n in names} for i in range(rows)), path)


def source(data, role, folder):
    """What the engine reads for `role` (train, eval or test): (file, None) for a path as it is
    or a text table written into `folder` as JSON Lines, ("", arrays) for a tokenized table, or
    ("", None) when there is no data."""
    if data is None:
        return "", None
    if isinstance(data, (str, os.PathLike)):
        return os.fspath(data), None
    if _is_dataset_dict(data):
        data = _split_of(data, role)
    if type(data).__name__ == "IterableDataset":
        raise TypeError("a streaming datasets.IterableDataset: brisk plans a run over a whole "
                        "dataset; pass a datasets.Dataset (or a file)")
    if _is_tokenized(data):
        return "", tokenized_split(data)
    return data_file(data, role, folder), None


def data_file(data, role, folder):
    """A JSON Lines file of text table `data` for `role`, written into `folder`."""
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
