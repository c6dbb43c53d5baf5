"""TrainingArguments: the options of a brisk run under transformers' names and defaults."""

import json
import os

from . import _brisk, checks


def _jsonable(value):
    """A TrainingArguments value as JSON holds it (enums by value, paths and the rest as text)."""
    value = getattr(value, "value", value)
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # a NumPy scalar
        value = value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


_SCRIPT_KEYS = ("do_train", "do_eval", "do_predict")


def _holds_arguments(value):
    """Whether `value` is a set of TrainingArguments: a dict, brisk's own, or an object with
    `to_dict()` (transformers' TrainingArguments and its subclasses, TRL's SFTConfig)."""
    return isinstance(value, (dict, TrainingArguments)) or (
        not isinstance(value, (str, bytes, os.PathLike)) and callable(getattr(value, "to_dict",
                                                                                 None)))


def _arguments_of(value):
    """The keys and values of such a set, as a dict."""
    if isinstance(value, TrainingArguments):
        given = value.given()
        given.update({k: value._values[k] for k in _SCRIPT_KEYS if k in value._values})
        return given
    values = value if isinstance(value, dict) else value.to_dict()
    if not isinstance(values, dict):
        raise TypeError("%s.to_dict() returned %s, not a dict"
                        % (type(value).__name__, type(values).__name__))
    bad = [k for k in values if not isinstance(k, str)]
    if bad:
        raise TypeError("TrainingArguments keys must be strings, not %r" % (bad[0],))
    return dict(values)


class TrainingArguments:
    """The options of `brisk train`, named and defaulted as transformers' TrainingArguments.

    The engine checks them when they are made: an unknown key, a value brisk cannot honour or
    options that contradict each other raise BriskError with the engine's message. Keys of
    transformers' TrainingArguments that change nothing in brisk are accepted and listed in
    `ignored_keys`.
    """

    def __init__(self, output_dir=None, **kwargs):
        given = dict(kwargs)
        if _holds_arguments(output_dir):  # TrainingArguments(args) of transformers' or a dict
            given = dict(_arguments_of(output_dir), **kwargs)
        elif output_dir is not None:
            if not isinstance(output_dir, (str, os.PathLike)):
                raise TypeError("output_dir must be a path, a TrainingArguments or a dict, not %s"
                                % type(output_dir).__name__)
            given["output_dir"] = checks.path(output_dir, "output_dir")
        given = {key: _jsonable(value) for key, value in given.items()}
        # As in transformers, do_train, do_eval and do_predict are for scripts: the Trainer's
        # method called decides what a run does.
        scripts = {key: given.pop(key) for key in _SCRIPT_KEYS if key in given}
        resolved = json.loads(_brisk.resolve_options(checks.dumps(given)))
        object.__setattr__(self, "_given", given)
        object.__setattr__(self, "_values", dict(resolved["options"], **scripts))
        object.__setattr__(self, "ignored_keys", list(resolved["ignored"]))

    @classmethod
    def from_dict(cls, values):
        """From a dict of TrainingArguments keys (e.g. transformers' `args.to_dict()`)."""
        if not isinstance(values, dict):
            raise TypeError("TrainingArguments.from_dict takes a dict, not %s"
                            % type(values).__name__)
        return cls(values)

    @classmethod
    def of(cls, args):
        """`args` as brisk's TrainingArguments: itself, a dict, an object with `to_dict()` (a
        transformers.TrainingArguments), or None for the defaults."""
        if args is None:
            return cls()
        if isinstance(args, cls):
            return args
        if _holds_arguments(args):
            return cls.from_dict(_arguments_of(args))
        raise TypeError("args must be brisk.TrainingArguments, transformers.TrainingArguments "
                        "or a dict, not %s" % type(args).__name__)

    def __getattr__(self, name):
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        raise AttributeError("TrainingArguments has no option %r" % name)

    def __setattr__(self, name, value):
        raise AttributeError("TrainingArguments are checked when made: use replace(%s=...)" % name)

    def replace(self, **changes):
        """A copy with `changes` applied (checked again)."""
        return TrainingArguments(self, **changes)

    def to_dict(self):
        """Every option's value, under brisk's names."""
        return dict(self._values)

    def given(self):
        """The keys given, as given (what runs pass to the engine)."""
        return dict(self._given)

    def __repr__(self):
        shown = ", ".join("%s=%r" % item for item in sorted(self._given.items()))
        return "TrainingArguments(%s)" % shown
