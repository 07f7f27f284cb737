"""Core's `Precision` in Keras's terms (a dtype policy name).

Core resolves the spellings (`resolve_precision`, `canonical_precision`); this module only
maps the typed value to a Keras dtype policy. Keras's own policy names are still accepted
as they are (`"mixed_bfloat16"`, `"bfloat16"`, ...).
"""

from __future__ import annotations

from typing import Any, Final

from pipekit_train.core.adapter import Precision, translate_precision

__all__ = ["KERAS_POLICIES", "NATIVE_PRECISIONS", "native_precision"]

KERAS_POLICIES: Final[dict[Precision, str | None]] = {
    Precision.FLOAT32: None,
    Precision.BFLOAT16_MIXED: "mixed_bfloat16",
    Precision.FLOAT16_MIXED: "mixed_float16",
}
"""Core's `Precision` → the Keras dtype policy (None: Keras's float32 default)."""

NATIVE_PRECISIONS: Final = ("float32", "mixed_bfloat16", "mixed_float16", "bfloat16", "float16")
"""The Keras dtype policies `Keras(precision=...)` takes as they are."""


def native_precision(value: Any) -> tuple[str | None, Precision | None]:
    """`(the Keras dtype policy, its canonical Precision)` of a `Keras(precision=...)`.

    None and a canonical name map through `KERAS_POLICIES`; a Keras policy name is kept
    as it is (its canonical precision is None when it has none, e.g. `"bfloat16"`);
    another spelling core knows (`"bf16-mixed"`, `"fp32"`) maps like its canonical name
    (core's `translate_precision`).

    Raises:
        ConfigError: none of these.
    """
    if value is None:
        return None, Precision.FLOAT32
    return translate_precision(
        value, KERAS_POLICIES, NATIVE_PRECISIONS, backend="a Keras dtype policy"
    )
