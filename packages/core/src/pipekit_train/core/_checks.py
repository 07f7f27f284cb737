"""Checks of plain values shared by every constructor: ints, positive ints, seeds."""

from __future__ import annotations

from typing import Any, overload

import numpy as np

from ._errors import ConfigError

__all__ = ["check_seed", "is_int", "positive_int"]


def is_int(value: Any) -> bool:
    """Whether `value` is an integer (Python or numpy), not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


@overload
def positive_int(
    name: str, value: Any, *, field: str | None = None, example: str | None = None
) -> int: ...


@overload
def positive_int(
    name: str, value: Any, *, allow_none: bool, field: str | None = None, example: str | None = None
) -> int | None: ...


def positive_int(
    name: str,
    value: Any,
    *,
    allow_none: bool = False,
    field: str | None = None,
    example: str | None = None,
) -> int | None:
    """`value` as an int ≥ 1 (or None when `allow_none`).

    Args:
        name: the argument's name, echoed as `Received: name=...`.
        value: what was passed.
        allow_none: None is accepted (and returned).
        field: how the argument is named in the message's first words (default `name`,
            e.g. `"Checkpoint.every_n_steps"`).
        example: a value that works, named in the fix (`Use e.g. name=example.`).

    Raises:
        ConfigError: anything else.
    """
    if value is None and allow_none:
        return None
    if not is_int(value) or value < 1:
        fix = " or None" if allow_none else ""
        use = f" Use e.g. {name}={example}." if example is not None else ""
        raise ConfigError(
            f"`{field or name}` must be a positive int{fix}. Received: {name}={value!r}.{use}"
        )
    return int(value)


def check_seed(seed: Any, *, name: str = "seed") -> int:
    """`seed` as a non-negative int.

    Raises:
        ConfigError: a bool, a non-integer or a negative number.
    """
    if not is_int(seed) or seed < 0:
        raise ConfigError(
            f"`{name}` must be a non-negative int. Received: {name}={seed!r}. Use e.g. {name}=0."
        )
    return int(seed)
