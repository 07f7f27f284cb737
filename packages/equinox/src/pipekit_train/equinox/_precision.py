"""Core's `Precision` in Equinox's terms: the jmp-style dtype `Policy` of the step.

Core resolves the spellings (`canonical_precision`); this module maps the typed value to
a `Policy` (`_mixed_precision`) through `JMP_POLICIES`. A jmp policy string is still
accepted as it is (`"params=float32,compute=bfloat16,output=float32"`).
"""

from __future__ import annotations

from typing import Any, Final

from pipekit_train.core.adapter import Precision, canonical_precision

from ._mixed_precision import Policy, parse_policy

__all__ = ["JMP_POLICIES", "native_precision"]

JMP_POLICIES: Final[dict[Precision, str | None]] = {
    Precision.FLOAT32: None,
    Precision.BFLOAT16_MIXED: "params=float32,compute=bfloat16,output=float32",
    Precision.FLOAT16_MIXED: "params=float32,compute=float16,output=float32",
}
"""Core's `Precision` → the jmp policy string that runs it (None: no casts)."""


def native_precision(precision: Any) -> tuple[Policy, Precision | None]:
    """The `Policy` of an `Equinox(precision=...)` value, and its canonical `Precision`.

    Core's names and their common spellings (resolved by core) map through
    `JMP_POLICIES`; anything else is read as a jmp policy string, whose canonical
    precision is None.

    Raises:
        ConfigError: neither a precision name nor a valid policy string.
    """
    if precision is None:
        return Policy(), Precision.FLOAT32
    canonical = canonical_precision(precision)
    if canonical is not None:
        return parse_policy(JMP_POLICIES[canonical]), canonical
    return parse_policy(precision), None
