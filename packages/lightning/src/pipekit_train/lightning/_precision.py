"""Core's `Precision` in Lightning's terms (`Trainer(precision=...)`).

Core resolves the spellings (`resolve_precision`, `canonical_precision`); this module only
maps the typed value to Lightning's name. Lightning's own names are still accepted as
they are (`"bf16-mixed"`, `"16-true"`, ...).
"""

from __future__ import annotations

from typing import Any, Final

from pipekit_train.core import ConfigError
from pipekit_train.core.adapter import Precision, canonical_precision

__all__ = ["LIGHTNING_PRECISIONS", "NATIVE_PRECISIONS", "trainer_precision"]

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


def trainer_precision(value: Any) -> tuple[Any, Precision | None]:
    """`(the Trainer's precision, its canonical Precision)` of a `Lightning(precision=...)`.

    A canonical name maps through `LIGHTNING_PRECISIONS`; a Lightning name is kept as it
    is (its canonical precision is None when it has none, e.g. `"bf16-true"`); another
    spelling core knows (`"mixed_bfloat16"`, `"fp32"`) maps like its canonical name.

    Raises:
        ConfigError: none of these.
    """
    if isinstance(value, str) and value in set(Precision):
        return LIGHTNING_PRECISIONS[Precision(value)], Precision(value)
    if value in NATIVE_PRECISIONS:
        return value, canonical_precision(value)
    canonical = canonical_precision(value)
    if canonical is not None:
        return LIGHTNING_PRECISIONS[canonical], canonical
    raise ConfigError(
        f"`precision` must be one of {[p.value for p in Precision]} (the same on every "
        f"backend) or a Lightning precision {sorted(map(str, NATIVE_PRECISIONS))}. "
        f"Received: precision={value!r}. On CPU use 'float32' or 'bfloat16-mixed'."
    )
