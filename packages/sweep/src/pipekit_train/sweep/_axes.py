"""How each sweep parameter should be drawn: log or linear, numeric or categorical.

An *axis* is a small JSON dict per parameter, derived from the search space and stored
in `sweep.json` (so `load_result` plots a finished sweep the same way):

- `{"scale": "log" | "linear", "discrete": bool}` for numbers; `discrete` means the
  values repeat (a grid, a stepped or small integer range), so a "best per value" line
  is meaningful; for a continuous parameter every trial has its own value and no line
  is drawn;
- `{"scale": "categorical", "discrete": True, "choices": [...]}` for choices, drawn on a
  categorical axis in the order the search space lists them, even when they are numbers.

Rules: an Optuna distribution says it directly (`log=True`, `step`,
`CategoricalDistribution`). A `ParameterGrid`'s numeric values use a log axis when they
are positive and span two decades or more, or are evenly spaced in ratio (16, 32, 64)
but not in difference. A plain list of parameter dicts is inferred the same way from
the values the trials ran with.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["axis_from_values", "describe_axes", "is_number", "value_key"]

_MAX_DISCRETE_INTS = 12


def is_number(value: Any) -> bool:
    """A real number (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def value_key(value: Any) -> str:
    """A canonical string for a JSON value (equal values, equal keys; 1 and 1.0 differ)."""
    return json.dumps(value, sort_keys=True)


def _log_spaced(values: Sequence[float]) -> bool:
    xs = sorted(set(values))
    if not xs or xs[0] <= 0 or len(xs) < 2:
        return False
    if xs[-1] / xs[0] >= 100:
        return True
    if len(xs) < 3:
        return False
    ratios = [b / a for a, b in zip(xs, xs[1:], strict=False)]
    diffs = [b - a for a, b in zip(xs, xs[1:], strict=False)]
    geometric = min(ratios) >= 1.5 and max(ratios) / min(ratios) < 1.3
    arithmetic = max(diffs) / min(diffs) < 1.3
    return geometric and not arithmetic


def axis_from_values(values: Iterable[Any], *, discrete: bool | None = None) -> dict[str, Any]:
    """The axis of a parameter from the values it takes.

    Args:
        values: the parameter's values (grid candidates, or what the trials ran with).
        discrete: whether the values repeat across trials; None: discrete when there
            are at most half as many distinct values as values.
    """
    seen: dict[str, Any] = {}
    count = 0
    for v in values:
        count += 1
        seen.setdefault(value_key(v), v)
    distinct = list(seen.values())
    if distinct and all(is_number(v) for v in distinct):
        if discrete is None:
            discrete = len(distinct) * 2 <= count
        return {
            "scale": "log" if _log_spaced([float(v) for v in distinct]) else "linear",
            "discrete": bool(discrete),
        }
    return {"scale": "categorical", "discrete": True, "choices": distinct}


def _from_distribution(dist: Any) -> dict[str, Any] | None:
    kind = type(dist).__name__
    if hasattr(dist, "choices"):  # CategoricalDistribution
        return {"scale": "categorical", "discrete": True, "choices": list(dist.choices)}
    if not (hasattr(dist, "low") and hasattr(dist, "high")):
        return None
    log = bool(getattr(dist, "log", False))
    step = getattr(dist, "step", None)
    if "Int" in kind:
        size = (int(dist.high) - int(dist.low)) // int(step or 1) + 1
        discrete = not log and size <= _MAX_DISCRETE_INTS
    else:
        discrete = (
            step is not None
            and (float(dist.high) - float(dist.low)) / float(step) < _MAX_DISCRETE_INTS
        )
    return {"scale": "log" if log else "linear", "discrete": bool(discrete)}


def describe_axes(search_space: Any) -> dict[str, dict[str, Any]]:
    """The axis of every parameter a search space declares (empty for a plain list).

    Args:
        search_space: an `OptunaSearch` (anything with `distributions`), a
            `ParameterGrid` (anything with `candidates()`), or anything else (no axes:
            they are inferred from the trials when plotting).
    """
    distributions = getattr(search_space, "distributions", None)
    if isinstance(distributions, Mapping):
        out = {}
        for name, dist in distributions.items():
            axis = _from_distribution(dist)
            if axis is not None:
                out[str(name)] = axis
        return out
    candidates = getattr(search_space, "candidates", None)
    if callable(candidates):
        return {
            name: axis_from_values(values, discrete=True) for name, values in candidates().items()
        }
    return {}
