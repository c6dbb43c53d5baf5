"""Checks of the values the package hands the engine: each argument by its name, and JSON text
without NaN or Infinity (strict JSON, which the engine reads, has neither).

A wrong type raises TypeError, a bad value ValueError, each naming the argument. A bool is no
number here: True where a count or a real is expected is a mistake, not 1.
"""

import json
import math
import numbers
import os

import numpy as np


def whole(value, name, low=0, high=2**63 - 1):
    """`value` as an int: an int or NumPy integer (not a bool) from `low` to `high`."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError("%s must be a whole number (an int), not %s"
                        % (name, type(value).__name__))
    if not low <= value <= high:
        raise ValueError("%s must be a whole number from %d to %s, got %d"
                         % (name, low, "2**63 - 1" if high == 2**63 - 1 else high, value))
    return int(value)


def real(value, name):
    """`value` as a float: a finite real number (an int, float or NumPy number; not a bool)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError("%s must be a number, not %s" % (name, type(value).__name__))
    try:
        number = float(value)
    except OverflowError:  # an int beyond every float
        number = math.inf
    if not math.isfinite(number):
        raise ValueError("%s must be a finite number, got %s" % (name, shown(value)))
    return number


def switch(value, name):
    """`value` as a bool: True or False (a NumPy bool too), never a truthy other value."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError("%s must be True or False, not %s" % (name, type(value).__name__))
    return bool(value)


def text(value, name):
    """`value` itself, a str."""
    if not isinstance(value, str):
        raise TypeError("%s must be a str, not %s" % (name, type(value).__name__))
    return value


def path(value, name):
    """`value` as a path string: a str or an os.PathLike naming one (not bytes)."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise TypeError("%s must be a path (a str or os.PathLike), not %s"
                        % (name, type(value).__name__))
    return value


def shown(value):
    """A value as a message shows it: its repr (a NumPy scalar's number's), at most 40
    characters."""
    text = repr(value.item() if isinstance(value, np.generic) else value)
    return text if len(text) <= 40 else text[:37] + "..."


def _plain(value):
    """json's `default`: a NumPy scalar as the Python number it holds; anything else refused."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError("a %s is no JSON value" % type(value).__name__)


def _named(keys):
    """The place of a key path as Python subscripts it: learning_rate, model['n_embd']."""
    return str(keys[0]) + "".join("[%r]" % (key,) for key in keys[1:]) if keys else "the value"


def dumps(value, root=None, where=None, **kwargs):
    """`value` as strict JSON text for the engine (NumPy scalars as their numbers). A value JSON
    cannot hold, a NaN or an infinity among them, is refused naming its place: `where(keys)` of
    the keys and indices down to it, by default as Python subscripts them from `root`."""
    try:
        return json.dumps(value, allow_nan=False, default=_plain, **kwargs)
    except (TypeError, ValueError):
        found = _unfit(value, [], set())
        if found is None:
            raise
    keys, bad = found
    place = where(keys) if where else _named(([root] if root else []) + keys)
    if isinstance(bad, float):
        raise ValueError("%s must be a finite number, got %s" % (place, shown(bad)))
    raise TypeError("%s must be text, a number, True/False, None, a list or a dict, not %s"
                    % (place, type(bad).__name__))


def _unfit(value, keys, open_containers):
    """(keys, value) of the first value in `value` that strict JSON cannot hold (a non-finite
    float, an object of another type), or None. A cycle is left to json, which names it."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return None if math.isfinite(value) else (keys, value)
    if value is None or isinstance(value, (str, int)) or id(value) in open_containers:
        return None
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return keys, value
    open_containers.add(id(value))
    for key, item in items:
        if not isinstance(key, (str, int, float, type(None))):
            return keys + [key], key
        found = _unfit(item, keys + [key], open_containers)
        if found is not None:
            return found
    open_containers.discard(id(value))
    return None
