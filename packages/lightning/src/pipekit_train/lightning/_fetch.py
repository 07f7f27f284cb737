"""Device values to the host: the `fetch` the run lifecycle gets on the torch backends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["fetch", "to_host"]


def to_host(value: Any) -> np.ndarray:
    """One tensor (or array-like) as a numpy array; half-precision floats become float32."""
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if value.dtype in (torch.bfloat16, torch.float16):
            value = value.float()
        return value.cpu().numpy()
    return np.asarray(value)


def fetch(values: Sequence[Any]) -> list[np.ndarray]:
    """Device scalars to host arrays in one transfer (stacked when they are alike)."""
    if not values:
        return []
    if all(type(v) is torch.Tensor and v.ndim == 0 for v in values):
        try:
            with torch.no_grad():
                stacked = torch.stack(list(values))
        except (RuntimeError, TypeError):  # mixed dtypes or devices
            pass
        else:
            if stacked.dtype in (torch.bfloat16, torch.float16):
                stacked = stacked.float()
            return list(stacked.cpu().numpy())
    return [to_host(v) for v in values]
