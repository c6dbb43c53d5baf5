"""Datasets handed to the engine: files as they are, text tables in memory as JSON Lines files,
tokenized tables as arrays the engine reads where they lie.

Text columns brisk tokenizes itself (chosen as run_glue, run_clm and run_mlm choose them): a
`datasets.Dataset` and a pandas DataFrame are written by their own vectorized JSON Lines writers,
plain Python columns or records by the json module; the engine's tokenization cache is keyed by
the file's bytes, so the same rows are tokenized once. A table with an `input_ids` column is
already tokenized: a Dataset's Arrow buffers are viewed as NumPy arrays without a copy (when their
ids are int32), other tables' lists are joined into one array each.

Every value is checked before the engine sees it, named by dataset (train_dataset, eval_dataset,
test_dataset), row (from 0, as Python indexes it) and column: a text table's cells are text,
finite numbers, True/False or None; a tokenized table's list columns (input_ids, token_type_ids,
attention_mask, per-token labels) hold lists of whole numbers in int32 range (ints, or floats of
whole value; a bool, None, text or a nested list is refused), its label column class ids (whole
numbers) or regression targets (finite reals), none missing (None, NaN, pandas' NA).
"""

import itertools
import math
import os

import numpy as np

from . import checks

_SPLITS = {"train": ("train",), "eval": ("validation", "eval", "valid", "dev"), "test": ("test",)}
_NAMES = {"train": "train_dataset", "eval": "eval_dataset", "test": "test_dataset"}
_ROWS = (list, tuple, np.ndarray)  # what a row of a list column may be
_CELLS = (str, int, float, type(None), np.number, np.bool_)  # what a text table's cell may be


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


def _size(data):
    """The rows of a table; None for what is no table, or a dict of what are no columns (the
    writers name them)."""
    if isinstance(data, dict):
        columns = list(data.values())
        if not all(hasattr(c, "__len__") and not isinstance(c, (str, bytes)) for c in columns):
            return None
        return max(map(len, columns), default=0)
    if isinstance(data, (list, tuple)) or hasattr(data, "column_names") or hasattr(data,
                                                                                  "columns"):
        return len(data)
    return None


def _column_lists(columns, name):
    """A dict of columns as lists of one length, each named by a str and a sequence of values."""
    lists = {}
    for column, values in columns.items():
        if not isinstance(column, str):
            raise TypeError("%s: column names are str, not %s" % (name, checks.shown(column)))
        if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
            raise TypeError("%s column %s must be a list of values, not %s"
                            % (name, column, type(values).__name__))
        lists[column] = list(values)
    if len({len(v) for v in lists.values()}) > 1:
        raise ValueError("%s: columns of different lengths: %s"
                         % (name, ", ".join("%s %d" % (n, len(v)) for n, v in lists.items())))
    return lists


def _missing(value):
    """Whether `value` stands for no value: None, NaN or pandas' NA."""
    return value is None or type(value).__name__ == "NAType" or (
        isinstance(value, (float, np.floating)) and math.isnan(value))


def _refusal(where, value):
    """The message refusing `value` at `where` (a dataset's row and column) as a number."""
    value = value.item() if isinstance(value, np.generic) else value
    if _missing(value):
        return "%s is missing (%s)" % (where, value)
    if isinstance(value, bool):
        return "%s: %r is a bool, not a number" % (where, value)
    if not isinstance(value, (int, float)):
        return "%s: %s is not a number" % (where, checks.shown(value))
    if not math.isfinite(value):
        return "%s: %r is not a finite number" % (where, value)
    if value != math.floor(value):
        return "%s: %r is not a whole number" % (where, value)
    return "%s: %s is outside int32" % (where, checks.shown(value))


def _kind(cls):
    """'i' for a whole-number type, 'f' for a real one, None for any other (bool among them)."""
    if issubclass(cls, (bool, np.bool_)):
        return None
    if issubclass(cls, (int, np.integer)):
        return "i"
    return "f" if issubclass(cls, (float, np.floating)) else None


def _number_array(items, where_of):
    """Python values (an object array) as int64 (all of whole-number types) or float64; the
    first that is no number refused naming its place, `where_of(index)`."""
    kinds = {_kind(t) for t in set(map(type, items))}
    if None in kinds:
        i = next(i for i, v in enumerate(items) if _kind(type(v)) is None)
        raise ValueError(_refusal(where_of(i), items[i]))
    try:
        return items.astype(np.int64 if kinds <= {"i"} else np.float64)
    except OverflowError:  # an int beyond int64
        i = next(i for i, v in enumerate(items)
                 if _kind(type(v)) == "i" and not -2**63 <= int(v) < 2**63)
        raise ValueError(_refusal(where_of(i), items[i])) from None


def _int32(values, where_of):
    """`values` as int32, viewed when they are int32 already; the first that is no whole number
    in int32 range refused naming its place, `where_of(index)`."""
    values = np.ascontiguousarray(values)  # (a view where it is contiguous already)
    if values.dtype == np.int32:
        return values
    kind = values.dtype.kind
    with np.errstate(invalid="ignore"):
        if kind == "u":
            good = values < 2**31
        elif kind in "if":
            good = (values >= -2**31) & (values < 2**31)
            if kind == "f":
                good &= np.floor(values) == values
        else:  # bools, text, objects: no token id
            good = np.zeros(values.shape, dtype=bool)
    if not good.all():
        i = int(np.argmin(good))
        raise ValueError(_refusal(where_of(i), values[i]))
    return values.astype(np.int32)


def _row_of(offsets, index):
    """The row of zero-based `offsets` that holds value `index`."""
    return int(np.searchsorted(offsets, index, side="right")) - 1


class _Columns:
    """A tokenized table's columns: lists(column) -> (offsets, values), scalars(column) -> an
    array, is_lists(column), names; place(row, column) names a cell in messages."""

    def __init__(self, name):
        self.name = name

    def place(self, row, column):
        return "%s row %d, column %s" % (self.name, row, column)


class _ArrowColumns(_Columns):
    """A datasets.Dataset's columns in its Arrow table, viewed without a copy where they can be."""

    def __init__(self, data, name):
        super().__init__(name)
        # Its Arrow table itself, unless rows were selected or shuffled (an indices mapping):
        # then a table of those rows.
        self.table = (data.data.table if getattr(data, "_indices", None) is None
                      else data.with_format("arrow")[:])
        self.names = list(self.table.column_names)

    def _array(self, column):
        chunks = self.table.column(column)
        # (combine_chunks copies even a single chunk.)
        return chunks.chunk(0) if chunks.num_chunks == 1 else chunks.combine_chunks()

    def is_lists(self, column):
        return hasattr(self._array(column), "values")

    def lists(self, column):
        array = self._array(column)
        if not hasattr(array, "values"):
            raise ValueError("%s column %s holds %s, not lists of numbers"
                             % (self.name, column, array.type))
        if array.null_count:
            first = int(np.argmax(array.is_null().to_numpy(zero_copy_only=False)))
            raise ValueError(_refusal(self.place(first, column), None))
        size = getattr(array.type, "list_size", None)  # a fixed-size list has no offsets
        offsets = (np.arange(len(array) + 1, dtype=np.int64) + array.offset) * size if size \
            else np.asarray(array.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
        return offsets, array.values.to_numpy(zero_copy_only=False)

    def scalars(self, column):
        return self.table.column(column).to_numpy()


class _PythonColumns(_Columns):
    """The columns of a pandas DataFrame, a dict of columns or a list of records, as lists."""

    def __init__(self, data, name):
        super().__init__(name)
        if hasattr(data, "columns") and hasattr(data, "to_numpy"):  # pandas.DataFrame
            data = {column: data[column] for column in data.columns}
        elif isinstance(data, (list, tuple)):
            for row, record in enumerate(data):
                if not isinstance(record, dict):
                    raise ValueError("%s row %d must be a record (a dict), not %s"
                                     % (name, row, type(record).__name__))
            data = {k: [r.get(k) for r in data] for k in data[0]}
        self.columns = _column_lists(data, name)
        self.names = list(self.columns)

    def is_lists(self, column):
        values = self.columns[column]
        return bool(values) and isinstance(values[0], _ROWS)

    def lists(self, column):
        rows = self.columns[column]
        for row, value in enumerate(rows):
            if not isinstance(value, _ROWS) or isinstance(value, np.ndarray) and value.ndim != 1:
                where = self.place(row, column)
                raise ValueError(_refusal(where, value) if _missing(value) else
                                 "%s: %s is not a list of numbers" % (where, checks.shown(value)))
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, rows), dtype=np.int64, count=len(rows)), out=offsets[1:])
        items = np.fromiter(itertools.chain.from_iterable(rows), dtype=object,
                            count=int(offsets[-1]))
        return offsets, _number_array(
            items, lambda i: self.place(_row_of(offsets, i), column))

    def scalars(self, column):
        values = self.columns[column]
        return np.fromiter(values, dtype=object, count=len(values))


def _list_column(columns, column):
    """List column `column` as zero-based offsets and its values as int32 (a view where they
    are int32 already), each checked."""
    offsets, values = columns.lists(column)
    zero_based = np.ascontiguousarray(offsets - offsets[0], dtype=np.int64)
    values = _int32(values[offsets[0]:offsets[-1]],
                    lambda i: columns.place(_row_of(zero_based, i), column))
    return zero_based, values


def _same_rows(columns, offsets, column, other):
    """Refuses list column `column` unless its rows are as long as input_ids' (`offsets`)."""
    if not np.array_equal(other, offsets):
        row = int(np.argmax(np.diff(other) != np.diff(offsets)))
        raise ValueError("%s row %d: %s and input_ids differ in length"
                         % (columns.name, row, column))


def _labels(columns, offsets, ids):
    """The split's labels: a class id (int32) or number (float32) per row; per-token labels (a
    causal LM's) only where they are the inputs, which a causal LM learns from anyway."""
    names = columns.names
    column = "labels" if "labels" in names else "label" if "label" in names else None
    if column is None:
        return {}

    def where_of(row):
        return columns.place(row, column)

    if columns.is_lists(column):
        label_offsets, values = _list_column(columns, column)
        if not (np.array_equal(label_offsets, offsets) and np.array_equal(values, ids)):
            raise ValueError("per-token labels other than the inputs (a causal LM learns "
                             "from its inputs): brisk reads no others yet")
        return {}
    labels = np.asarray(columns.scalars(column))
    if labels.dtype.kind not in "iuf":  # Python values, bools, text
        labels = _number_array(labels.astype(object), where_of)
    if labels.dtype.kind != "f":
        return {"labels": _int32(labels, where_of)}
    with np.errstate(invalid="ignore"):
        good = np.abs(labels) <= np.finfo(np.float32).max  # (NaN and infinities are not)
    if not good.all():
        i = int(np.argmin(good))
        raise ValueError("%s: %r is outside float32" % (where_of(i), float(labels[i]))
                         if np.isfinite(labels[i]) else _refusal(where_of(i), labels[i]))
    return {"values": np.ascontiguousarray(labels, dtype=np.float32)}


def tokenized_split(data, name="train_dataset"):
    """A tokenized table's arrays as the engine views them: offsets (int64), ids (int32), types
    (int32, where token_type_ids is given), labels (int32) or values (float32). `name` names
    the table in messages."""
    columns = (_ArrowColumns(data, name) if hasattr(data, "column_names")
               and hasattr(data, "with_format") else _PythonColumns(data, name))
    offsets, ids = _list_column(columns, "input_ids")
    split = {"offsets": offsets, "ids": ids}
    if "attention_mask" in columns.names:
        mask_offsets, mask = _list_column(columns, "attention_mask")
        _same_rows(columns, offsets, "attention_mask", mask_offsets)
        if not np.all(mask):
            raise ValueError("%s row %d: padded rows (zeros in attention_mask): tokenize "
                             "without padding, brisk pads each batch itself"
                             % (name, _row_of(offsets, int(np.argmin(mask != 0)))))
    if "token_type_ids" in columns.names:
        type_offsets, split["types"] = _list_column(columns, "token_type_ids")
        _same_rows(columns, offsets, "token_type_ids", type_offsets)
    split.update(_labels(columns, offsets, ids))
    return split


def _check_columns(columns):
    if "input_ids" in columns:
        raise ValueError("internal: a tokenized table reached the text writer")


def _write_records(records, path, name):
    """Records as JSON Lines, each cell checked (text, a finite number, True/False or None);
    a refused record leaves no file behind."""
    try:
        with open(path, "w", encoding="utf-8") as out:
            for row, record in enumerate(records):
                out.write(_record_line(record, row, name) + "\n")
    except BaseException:
        os.remove(path)
        raise


def _record_line(record, row, name):
    for column, value in record.items():
        if not isinstance(column, str):
            raise TypeError("%s row %d: column names are str, not %s"
                            % (name, row, checks.shown(column)))
        if not isinstance(value, _CELLS):
            raise ValueError("%s row %d, column %s must be text, a number, True/False or None, "
                             "not %s" % (name, row, column, type(value).__name__))
    return checks.dumps(record, where=lambda keys: "%s row %d, column %s" % (name, row, keys[0]),
                        ensure_ascii=False)


def _write_columns(columns, path, name):
    columns = _column_lists(columns, name)
    rows = len(next(iter(columns.values()))) if columns else 0
    _write_records(({n: v[i] for n, v in columns.items()} for i in range(rows)), path, name)


def source(data, role, folder):
    """What the engine reads for `role` (train, eval or test): (file, None) for a path as it is
    or a text table written into `folder` as JSON Lines, ("", arrays) for a tokenized table, or
    ("", None) when there is no data."""
    name = _NAMES[role]
    if data is None:
        return "", None
    if isinstance(data, (str, os.PathLike)):
        return checks.path(data, name), None
    if _is_dataset_dict(data):
        data = _split_of(data, role)
    if type(data).__name__ == "IterableDataset":
        raise TypeError("a streaming datasets.IterableDataset: brisk plans a run over a whole "
                        "dataset; pass a datasets.Dataset (or a file)")
    if _size(data) == 0:
        raise ValueError("%s is empty" % name)
    if _is_tokenized(data):
        return "", tokenized_split(data, name)
    return data_file(data, role, folder), None


def _check_finite(table, name, role):
    """The real-valued columns of an Arrow table or a DataFrame hold no infinity, and the labels
    of a train or eval split no NaN (a test split's NaN is a row without a label): their own JSON
    writers would write either as null, which the engine would then blame on the file written
    here. One vectorized pass per real column."""
    is_arrow = hasattr(table, "schema")
    for column in (table.column_names if is_arrow else list(table.columns)):
        values = table.column(column) if is_arrow else table[column]
        try:
            values = np.asarray(values.to_numpy(zero_copy_only=False) if is_arrow
                                else values.to_numpy(), dtype=np.float64)
        except (TypeError, ValueError, AttributeError):
            continue  # not a real-valued column
        if values.ndim != 1:
            continue
        labels = column in ("label", "labels") and role != "test"
        bad = np.isinf(values) | (np.isnan(values) if labels else False)
        if bad.any():
            row = int(np.argmax(bad))
            raise ValueError("%s row %d, column %s must be a finite number, got %r"
                             % (name, row, column, float(values[row])))


def data_file(data, role, folder):
    """A JSON Lines file of text table `data` for `role`, written into `folder`."""
    name = _NAMES[role]
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, role + ".jsonl")
    if hasattr(data, "column_names") and hasattr(data, "to_json"):  # datasets.Dataset
        _check_columns(data.column_names)
        _check_finite(data.data.table if getattr(data, "_indices", None) is None
                      else data.with_format("arrow")[:], name, role)
        data.to_json(path, lines=True, force_ascii=False)
    elif hasattr(data, "columns") and hasattr(data, "to_json"):  # pandas.DataFrame
        _check_columns(list(data.columns))
        _check_finite(data, name, role)
        data.to_json(path, orient="records", lines=True, force_ascii=False)
    elif isinstance(data, dict):
        _check_columns(list(data))
        _write_columns(data, path, name)
    elif isinstance(data, (list, tuple)):
        for row, record in enumerate(data):
            if not isinstance(record, (dict, str)):
                raise ValueError("%s row %d must be a record (a dict) or a text (a str), not %s"
                                 % (name, row, type(record).__name__))
        records = [r if isinstance(r, dict) else {"text": r} for r in data]
        _check_columns({k for r in records for k in r})
        _write_records(records, path, name)
    else:
        raise TypeError("%s: a dataset is a file path, a datasets.Dataset or DatasetDict, a "
                        "pandas DataFrame, a dict of columns or a list of records, not %s"
                        % (name, type(data).__name__))
    return path
