"""`ParameterGrid`: the Cartesian product of parameter values, in a documented order."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, overload

import numpy as np

from pipekit_train.core import ConfigError

__all__ = ["ParameterGrid", "check_params", "to_json_value"]


def to_json_value(value: Any, *, where: str) -> Any:
    """Return `value` as plain JSON data (numpy scalars become Python numbers).

    Raises:
        ConfigError: the value cannot be written to the sweep journal as JSON.
    """
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(
                f"Parameter values must be finite. Received: {where}={value!r}. Use a finite number."
            )
        return value
    if isinstance(value, (list, tuple)):
        return [to_json_value(v, where=f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError(
                    f"Nested parameter keys must be strings. Received: key {k!r} in {where}."
                )
            out[k] = to_json_value(v, where=f"{where}[{k!r}]")
        return out
    raise ConfigError(
        "Parameter values must be JSON data (numbers, strings, bools, None, lists, dicts) so "
        f"every trial can be journaled and re-run. Received: {where}={value!r} "
        f"({type(value).__name__}). Pass a name or a number and build the object in the trial."
    )


def check_params(params: Any, *, where: str = "params") -> dict[str, Any]:
    """Validate one parameter set (a mapping with string keys and JSON values) and copy it."""
    if not isinstance(params, Mapping):
        raise ConfigError(
            f"Each parameter set must be a dict of name -> value. Received: {where}={params!r}."
        )
    out: dict[str, Any] = {}
    for key, value in params.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(
                f"Parameter names must be non-empty strings. Received: key {key!r} in {where}."
            )
        out[key] = to_json_value(value, where=f"{where}[{key!r}]")
    json.dumps(out, allow_nan=False)
    return out


def _values_of(key: Any, values: Any, where: str) -> list[Any]:
    if not isinstance(key, str) or not key:
        raise ConfigError(
            f"`ParameterGrid` keys must be non-empty strings. Received: key={key!r} in {where}."
        )
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise ConfigError(
                f"`ParameterGrid` values must be one-dimensional. Received: {key}=array of shape "
                f"{values.shape}. Pass a list of values."
            )
        values = values.tolist()
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, (Sequence, range)):
        raise ConfigError(
            f"`ParameterGrid` values must be lists of candidate values. Received: {key}={values!r}. "
            f"Wrap a single value in a list: {key}=[{values!r}]."
        )
    values = list(values)
    if not values:
        raise ConfigError(
            f"`ParameterGrid` values must not be empty. Received: {key}=[]. Give at least one "
            "value, or drop the key."
        )
    return [to_json_value(v, where=f"{key}[{i}]") for i, v in enumerate(values)]


class ParameterGrid:
    """The Cartesian product of parameter values, as a sequence of param dicts.

    Order is deterministic: keys keep their insertion order and the **last key varies
    fastest** (like `itertools.product` and scikit-learn's `ParameterGrid`, except that
    keys are not sorted). Several grids (a list of dicts) are concatenated in order.

    Args:
        grid: `{name: [values...]}`, or a list of such dicts. Values must be JSON data
            (numbers, strings, bools, None, lists, dicts) so every trial can be journaled.

    Examples:
        >>> from pipekit_train.sweep import ParameterGrid
        >>> grid = ParameterGrid({"lr": [1e-3, 1e-2], "batch_size": [16, 32]})
        >>> len(grid)
        4
        >>> grid[0], grid[1]
        ({'lr': 0.001, 'batch_size': 16}, {'lr': 0.001, 'batch_size': 32})
        >>> grid[-1]
        {'lr': 0.01, 'batch_size': 32}

    Raises:
        ConfigError: a value list is empty, a value is not a list, or a value is not JSON.
    """

    def __init__(self, grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Sequence[Any]]]):
        if isinstance(grid, Mapping):
            grids = [grid]
        elif (
            isinstance(grid, Sequence)
            and not isinstance(grid, (str, bytes))
            and all(isinstance(g, Mapping) for g in grid)
        ):
            grids = list(grid)
            if not grids:
                raise ConfigError(
                    "`ParameterGrid` needs at least one grid. Received: grid=[]. "
                    "Pass a dict such as {'lr': [1e-3, 1e-2]}."
                )
        else:
            raise ConfigError(
                "`ParameterGrid` takes a dict of lists, e.g. {'lr': [1e-3, 1e-2]}, or a list of "
                f"such dicts. Received: grid={grid!r}."
            )
        self._grids: list[tuple[list[str], list[list[Any]]]] = []
        for i, g in enumerate(grids):
            where = "grid" if len(grids) == 1 else f"grid[{i}]"
            keys = list(g)
            self._grids.append((keys, [_values_of(k, g[k], where) for k in keys]))
        self._sizes = [math.prod(len(v) for v in values) for _, values in self._grids]

    @property
    def keys(self) -> list[str]:
        """Every parameter name, in first-seen order."""
        out: list[str] = []
        for keys, _ in self._grids:
            out.extend(k for k in keys if k not in out)
        return out

    def candidates(self) -> dict[str, list[Any]]:
        """Every parameter's candidate values, in grid order (several grids: concatenated)."""
        out: dict[str, list[Any]] = {}
        for keys, values in self._grids:
            for key, vals in zip(keys, values, strict=True):
                out.setdefault(key, []).extend(vals)
        return out

    def __len__(self) -> int:
        return sum(self._sizes)

    def _item(self, index: int) -> dict[str, Any]:
        for (keys, values), size in zip(self._grids, self._sizes, strict=True):
            if index < size:
                out: dict[str, Any] = {}
                # Mixed-radix decoding: the last key is the least significant digit.
                for key, vals in zip(reversed(keys), reversed(values), strict=True):
                    index, digit = divmod(index, len(vals))
                    out[key] = vals[digit]
                return {k: out[k] for k in keys}
            index -= size
        raise AssertionError("unreachable")

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):
            return [self._item(i) for i in range(*index.indices(len(self)))]
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(
                f"ParameterGrid indices must be integers or slices, not {type(index).__name__}"
            )
        n = len(self)
        i = int(index) + n if index < 0 else int(index)
        if not 0 <= i < n:
            raise IndexError(f"ParameterGrid index {index} is out of range for {n} parameter sets")
        return self._item(i)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self)):
            yield self._item(i)

    def __repr__(self) -> str:
        parts = [
            "{" + ", ".join(f"{k!r}: {v!r}" for k, v in zip(keys, values, strict=True)) + "}"
            for keys, values in self._grids
        ]
        inner = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
        return f"ParameterGrid({inner})"
