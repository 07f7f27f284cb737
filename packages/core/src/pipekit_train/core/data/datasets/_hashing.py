"""Stable fingerprints: describe callables and hash arrays without memory addresses.

A fingerprint is a SHA-256 hex digest of a canonical description of a dataset's
content or source. It must be the same in every process and on every machine for
the same content, so nothing here may depend on `id()`, memory addresses or dict
order.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["Hasher", "fingerprint_callable"]


class Hasher:
    """An incremental SHA-256 over JSON values and numpy arrays."""

    def __init__(self, tag: str) -> None:
        self._h = hashlib.sha256()
        self.update_json({"pipekit_fingerprint": tag, "format": 1})

    def update_json(self, value: Any) -> None:
        """Hash a JSON-serialisable value (canonical: sorted keys, no spaces)."""
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
        self._h.update(len(text).to_bytes(8, "little"))
        self._h.update(text.encode())

    def update_array(self, array: np.ndarray) -> None:
        """Hash an array's dtype, shape and bytes (C order)."""
        array = np.ascontiguousarray(array)
        self.update_json({"dtype": array.dtype.str, "shape": list(array.shape)})
        self._h.update(array.data.cast("B"))  # `array.data` is `memoryview(array)`

    def update_sample(self, sample: Mapping[str, np.ndarray]) -> None:
        """Hash a sample or batch dict key by key in sorted order."""
        for key in sorted(sample):
            self.update_json(key)
            self.update_array(np.asarray(sample[key]))

    def hexdigest(self) -> str:
        """The hex digest of everything hashed so far."""
        return self._h.hexdigest()


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        h = Hasher("array")
        h.update_array(value)
        return {"array": h.hexdigest()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return fingerprint_callable(value)


def fingerprint_callable(fn: Any) -> Any:
    """A JSON description of a callable that is stable across processes.

    Functions, classes and ufuncs are described by `module:qualname`; operators with
    `get_config()` by their type and config; `functools.partial` by its function and
    arguments; other objects by their type. Closures and lambdas are described by name
    only, so fingerprints also hash a few computed samples (a content probe).
    """
    if isinstance(fn, functools.partial):
        return {
            "partial": fingerprint_callable(fn.func),
            "args": _jsonable(list(fn.args)),
            "kwargs": _jsonable(dict(sorted(fn.keywords.items()))),
        }
    get_config = getattr(fn, "get_config", None)
    if callable(get_config) and not isinstance(fn, type):
        try:
            config = _jsonable(get_config())
        except Exception:  # a config is descriptive only; fall back to the type
            config = None
        return {"type": _name(type(fn)), "config": config}
    bound_self = getattr(fn, "__self__", None)
    if bound_self is not None and not isinstance(bound_self, type) and callable(fn):
        if not type(bound_self).__module__ == "builtins":
            return {"method": getattr(fn, "__name__", "?"), "of": fingerprint_callable(bound_self)}
    if hasattr(fn, "__qualname__") or isinstance(fn, np.ufunc):
        return _name(fn)
    return {"type": _name(type(fn))}


def _name(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or type(obj).__module__
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if qualname is None:
        qualname = type(obj).__qualname__
    return f"{module}:{qualname}"
