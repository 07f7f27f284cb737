"""Core's `Precision` in Lightning's terms (`Trainer(precision=...)`).

Core resolves the spellings and translates them (`translate_precision`); this module only
gives it Lightning's table. Lightning's own names are still accepted as
they are (`"bf16-mixed"`, `"16-true"`, ...).
"""

from __future__ import annotations

from typing import Any, Final

from pipekit_train.core.adapter import Precision, translate_precision

__all__ = ["LIGHTNING_PRECISIONS", "NATIVE_PRECISIONS", "native_precision"]

LIGHTNING_PRECISIONS: Final[dict[Precision, str]] = {
    Precision.FLOAT32: "32-true",
    Precision.BFLOAT16_MIXED: "bf16-mixed",
    Precision.FLOAT16_MIXED: "16-mixed",
}
"""Core's `Precision` → Lightning's precision name."""

NATIVE_PRECISIONS: Final = frozenset(
    {
        "64",
        "32",
        "16",
        "bf16",
        64,
        32,
        16,
        "64-true",
        "32-true",
        "16-true",
        "bf16-true",
        "16-mixed",
        "bf16-mixed",
        "transformer-engine",
        "transformer-engine-float16",
    }
)
"""The precision values `lightning.Trainer` takes itself."""


def native_precision(value: Any) -> tuple[Any, Precision | None]:
    """`(the Trainer's precision, its canonical Precision)` of a `Lightning(precision=...)`.

    Core's `translate_precision` with Lightning's table: a canonical name maps through
    `LIGHTNING_PRECISIONS`; a Lightning name is kept as it is (its canonical precision is
    None when it has none, e.g. `"bf16-true"`); another spelling core knows
    (`"mixed_bfloat16"`, `"fp32"`) maps like its canonical name.

    Raises:
        ConfigError: none of these.
    """
    return translate_precision(
        value,
        LIGHTNING_PRECISIONS,
        NATIVE_PRECISIONS,
        backend="a Lightning precision",
        hint="On CPU use 'float32' or 'bfloat16-mixed'.",
    )
