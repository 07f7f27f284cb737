"""`to_json_value`: any metric, config or array value as plain JSON."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._errors import ConfigError

__all__ = ["to_json_value"]


def to_json_value(value: Any, *, field_name: str) -> Any:
    """Return `value` as plain JSON (dict/list/str/int/float/bool/None).

    numpy scalars and arrays become Python numbers and lists, tuples become lists,
    non-finite floats become the strings `"nan"`, `"inf"`, `"-inf"` (strict JSON has no
    NaN), and objects with `to_json()` are replaced by what it returns.

    Raises:
        ConfigError: something cannot be represented as JSON.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, np.bool_):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else ("nan" if math.isnan(f) else ("inf" if f > 0 else "-inf"))
    if isinstance(value, np.ndarray):
        return to_json_value(value.tolist(), field_name=field_name)
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError(
                    f"`{field_name}` must have string keys to be stored as JSON. "
                    f"Received: key {k!r} of type {type(k).__name__}. Use str keys."
                )
            out[k] = to_json_value(v, field_name=field_name)
        return out
    if isinstance(value, (list, tuple)):
        return [to_json_value(v, field_name=field_name) for v in value]
    to_json = getattr(value, "to_json", None)
    if callable(to_json):
        got = to_json()
        if isinstance(got, str):
            got = json.loads(got)
        return to_json_value(got, field_name=field_name)
    raise ConfigError(
        f"`{field_name}` must be JSON-serialisable (numbers, strings, lists, dicts). "
        f"Received: a {type(value).__name__} ({value!r:.80}). Convert it to plain JSON first."
    )
