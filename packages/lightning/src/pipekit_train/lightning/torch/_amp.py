"""Mixed precision for the plain-torch steps: core's precision names as autocast + scaler.

| core name | autocast | grad scaler |
|---|---|---|
| `float32` | off | none |
| `bfloat16-mixed` | `torch.autocast(device, torch.bfloat16)` over forward and loss | none |
| `float16-mixed` | `torch.autocast(device, torch.float16)` over forward and loss | `torch.amp.GradScaler(device)` |

Parameters, gradients and optimizer state stay in the module's dtype; the backward pass
runs outside autocast (as in Lightning's mixed-precision plugins).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from pipekit_train.core.adapter import resolve_precision

__all__ = ["Amp", "amp_for"]


@dataclass(frozen=True)
class Amp:
    """How a step runs under one precision.

    Attributes:
        name: the canonical precision name.
        dtype: the autocast dtype (None: no autocast).
        scaled: whether the loss is scaled by a `GradScaler`.
    """

    name: str
    dtype: torch.dtype | None = None
    scaled: bool = False

    def autocast(self, device: torch.device) -> Any:
        """The autocast context for `device` (a null context under float32)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.dtype)

    def scaler(self, device: torch.device) -> Any:
        """A fresh `GradScaler` for `device`, or None when the loss is not scaled."""
        if not self.scaled:
            return None
        return torch.amp.GradScaler(device.type)


_TABLE = {
    "float32": Amp("float32"),
    "bfloat16-mixed": Amp("bfloat16-mixed", torch.bfloat16),
    "float16-mixed": Amp("float16-mixed", torch.float16, scaled=True),
}


def amp_for(precision: str | None) -> Amp:
    """The `Amp` of a precision name (core's names and their common spellings).

    Raises:
        ConfigError: an unknown name (core's message lists the accepted ones).
    """
    return _TABLE[resolve_precision(precision)]
