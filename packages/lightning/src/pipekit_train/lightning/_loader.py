"""Torch `DataLoader` batches as core's numpy batch dicts (the `Torch()` native data path).

A loader's batch is a dict with `"x"` and `"y"` or an `(x, y)` pair of tensors (or
arrays); it becomes `{"x": ..., "y": ...}` without copying (`Tensor.numpy()` shares
memory), and the step backend's `put` turns it back into tensors, again without a copy.
A plain `DataLoader` has no position to save, so a resume restarts it from its first
batch (core warns); use a core dataset for an exact resume.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["as_batch", "loader_batches", "loader_pass"]


def _host(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if value.dtype in (torch.bfloat16, torch.float16):
            value = value.float()
        return value.cpu().numpy()
    return np.asarray(value)


def as_batch(batch: Any) -> dict[str, np.ndarray]:
    """A loader batch as `{"x": ..., "y": ...}` numpy arrays (see the module docs)."""
    if isinstance(batch, Mapping):
        if "x" not in batch or "y" not in batch:
            raise TypeError(
                "A DataLoader batch dict needs 'x' and 'y'. "
                f"Received: keys={sorted(map(str, batch))}."
            )
        return {str(k): _host(v) for k, v in batch.items()}
    if isinstance(batch, Sequence) and len(batch) >= 2:
        return {"x": _host(batch[0]), "y": _host(batch[1])}
    raise TypeError(
        "A DataLoader batch must be a dict with 'x' and 'y' or an (x, y) pair. "
        f"Received: {type(batch).__name__}."
    )


def loader_batches(loader: Any) -> Iterator[dict[str, np.ndarray]]:
    """Endless batches: the loader's epochs one after the other."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield as_batch(batch)
        if empty:
            raise ValueError("The training DataLoader yielded no batches.")


def loader_pass(loader: Any) -> Iterator[dict[str, np.ndarray]]:
    """One pass over the loader (validation)."""
    for batch in loader:
        yield as_batch(batch)
