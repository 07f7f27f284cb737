"""Data for Lightning: core batches as tensors, and recognising native loaders.

`BatchFeed` is the iterable handed to `Trainer.fit` when the data is a core dataset. It
pulls numpy batches from core's batching engine (`RunContext.train_batches`: the same
order as every other backend for the same seed), converts them with `torch.from_numpy`
(zero-copy; floating arrays take the model's dtype) and yields them already batched, so
Lightning never collates per sample. Lightning prefetches one batch ahead, so the feed
records the iterator state after each batch it hands out; the checkpoint stores the
state after the last batch *trained on*, not after the prefetched one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeGuard

import torch

if TYPE_CHECKING:
    from lightning import LightningDataModule

__all__ = ["BatchFeed", "is_datamodule", "is_native_loader"]


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


class BatchFeed:
    """An iterable of tensor batches over a core `BatchIterator` (see the module docs).

    Args:
        dtype: floating arrays are cast to this dtype (the model's).
        keep: how many recent iterator states to keep (at least the batches of one
            optimizer step plus Lightning's prefetch).
    """

    def __init__(self, dtype: torch.dtype = torch.float32, keep: int = 16):
        self.dtype = dtype
        self._it: Any = None
        self._yielded = 0
        self._states: deque[tuple[int, dict[str, Any]]] = deque(maxlen=max(16, keep))
        self._start_state: dict[str, Any] | None = None

    def start(self, iterator: Any) -> None:
        """Attach the core batch iterator (already positioned for a resume)."""
        self._it = iterator
        self._yielded = 0
        self._states.clear()
        self._start_state = iterator.get_state()

    def state_after(self, consumed: int) -> dict[str, Any] | None:
        """The iterator state after `consumed` batches of this run were trained on."""
        if consumed == 0:
            return self._start_state
        for n, state in reversed(self._states):
            if n == consumed:
                return state
        return None

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
        if self._it is None:
            raise RuntimeError("BatchFeed.start() was not called before iteration")
        it, states = self._it, self._states
        while True:
            batch = self._convert(next(it))
            self._yielded += 1
            states.append((self._yielded, it.get_state()))
            yield batch
