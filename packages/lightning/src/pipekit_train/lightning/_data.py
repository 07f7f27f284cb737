"""Data for the torch backends: core batches as tensors, native loaders as numpy batches.

- `TensorBatches` is the iterable handed to `Trainer.fit` when the data is a core
  dataset: it pulls numpy batches from the run's `Feed` (core's batching engine: the
  same order as every other backend for the same seed; the feed remembers the data
  position after each batch, since Lightning reads one ahead), converts them with
  `torch.from_numpy` (zero-copy; floating arrays take the model's dtype) and yields
  them already batched, so Lightning never collates per sample.
- `unpack`, `as_batch`, `native_batches`, `native_eval_batches`: a torch `DataLoader`'s batch
  (a dict with `"x"`/`"y"` or an `(x, y)` pair) as core's numpy batch dict, without
  copying on the CPU (`Tensor.numpy()` shares memory): `Torch()`'s native training
  batches and both backends' native validation batches. A plain `DataLoader` has no
  position to save, so a resume restarts it from its first batch.
- `is_datamodule`, `is_native_loader`: recognising native loaders without importing
  lightning.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

import numpy as np
import torch

from ._fetch import to_host

if TYPE_CHECKING:
    from lightning import LightningDataModule

__all__ = [
    "TensorBatches",
    "as_batch",
    "is_datamodule",
    "is_native_loader",
    "native_batches",
    "native_eval_batches",
    "unpack",
]


def is_datamodule(data: object) -> TypeGuard[LightningDataModule]:
    """Whether `data` is a `LightningDataModule` (checked without importing lightning)."""
    return any(
        cls.__name__ == "LightningDataModule"
        and cls.__module__.split(".")[0] in ("lightning", "pytorch_lightning")
        for cls in type(data).__mro__
    )


def is_native_loader(data: Any) -> bool:
    """Whether `data` is a torch `DataLoader` (incl. torchdata's) or a `LightningDataModule`."""
    return isinstance(data, torch.utils.data.DataLoader) or is_datamodule(data)


class TensorBatches:
    """An iterable of tensor batches over the run's numpy batches (see the module docs).

    Args:
        batches: the run's `Feed` (an endless iterator of numpy batch dicts).
        dtype: floating arrays are cast to this dtype (the model's).
    """

    def __init__(self, batches: Iterator[Mapping[str, Any]], dtype: torch.dtype = torch.float32):
        self.batches = batches
        self.dtype = dtype

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self._generate()

    def _convert(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        out = {}
        dtype = self.dtype
        for key, value in batch.items():
            t = torch.from_numpy(value)
            if t.is_floating_point() and t.dtype != dtype:
                t = t.to(dtype)
            out[key] = t
        return out

    def _generate(self) -> Iterator[dict[str, torch.Tensor]]:
        it = self.batches
        while True:
            yield self._convert(next(it))


# -- native loaders -------------------------------------------------------------------------
def unpack(batch: Any) -> tuple[Any, Any]:
    """`(x, y)` of a batch: a dict with `"x"`/`"y"` (core) or a pair (torch loaders)."""
    if isinstance(batch, Mapping):
        return batch["x"], batch["y"]
    if isinstance(batch, Sequence) and len(batch) >= 2:
        return batch[0], batch[1]
    raise TypeError(
        "A training batch must be a dict with 'x' and 'y' or an (x, y) pair. "
        f"Received: {type(batch).__name__}."
    )


def as_batch(batch: Any) -> dict[str, np.ndarray]:
    """A loader batch as `{"x": ..., "y": ...}` numpy arrays (see the module docs)."""
    if isinstance(batch, Mapping):
        if "x" not in batch or "y" not in batch:
            raise TypeError(
                "A DataLoader batch dict needs 'x' and 'y'. "
                f"Received: keys={sorted(map(str, batch))}."
            )
        return {str(k): to_host(v) for k, v in batch.items()}
    if isinstance(batch, Sequence) and len(batch) >= 2:
        return {"x": to_host(batch[0]), "y": to_host(batch[1])}
    raise TypeError(
        "A DataLoader batch must be a dict with 'x' and 'y' or an (x, y) pair. "
        f"Received: {type(batch).__name__}."
    )


def native_batches(loader: Any) -> Iterator[dict[str, np.ndarray]]:
    """Endless batches: the loader's epochs one after the other."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield as_batch(batch)
        if empty:
            raise ValueError("The training DataLoader yielded no batches.")


def native_eval_batches(loader: Any) -> Iterator[dict[str, np.ndarray]]:
    """One pass over the loader (validation)."""
    for batch in loader:
        yield as_batch(batch)
