"""Typed run policies of the canonical spec: the non-finite policy and the precision.

Both are `str` enums, so the surface keeps taking (and comparing equal to) the plain
strings, and JSON writes them as those strings: `NonFinitePolicy("skip") == "skip"` and
`json.dumps(Precision.BFLOAT16_MIXED) == '"bfloat16-mixed"'`. Core resolves every
spelling once (`nonfinite_policy`, `resolve_precision` in `_spec`); adapters map the
typed value to their framework (each adapter package's `_precision.py`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pipekit_train.core._errors import ConfigError

__all__ = ["NonFinitePolicy", "Precision", "nonfinite_policy"]


class NonFinitePolicy(StrEnum):
    """What a non-finite training loss does (`TrainingLoop(on_nonfinite=...)`).

    Attributes:
        STOP: end the run with `NonFiniteLossError` naming the first such step.
        SKIP: drop that step's update and count it; stop after `max_consecutive_skips`.
        IGNORE: train on.
    """

    STOP = "stop"
    SKIP = "skip"
    IGNORE = "ignore"


class Precision(StrEnum):
    """The precision vocabulary every backend understands.

    Attributes:
        FLOAT32: everything in float32.
        BFLOAT16_MIXED: parameters in float32, computation in bfloat16.
        FLOAT16_MIXED: the same with float16 and dynamic loss scaling.
    """

    FLOAT32 = "float32"
    BFLOAT16_MIXED = "bfloat16-mixed"
    FLOAT16_MIXED = "float16-mixed"


def nonfinite_policy(value: Any, *, field: str = "on_nonfinite") -> NonFinitePolicy:
    """The `NonFinitePolicy` of `value` (a policy or its string).

    Raises:
        ConfigError: any other value, naming `field` and the accepted names.
    """
    if isinstance(value, str):
        try:
            return NonFinitePolicy(value)
        except ValueError:
            pass
    raise ConfigError(
        f"`{field}` must be one of {[p.value for p in NonFinitePolicy]}. Received: "
        f"{field}={value!r}."
    )
