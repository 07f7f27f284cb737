"""`MapBatchIterator`: batches of an indexable dataset from a grain `MapDataset` pipeline.

The pipeline is batch-level, not record-level:

```python
grain.MapDataset.range(blocks_per_epoch).repeat(num_epochs).map_with_index(gather_block)
```

Each element is a *block* of up to `K` consecutive batches of the epoch order,
gathered with one `get_batch` call and sliced into batches. `K = 1` unless the
dataset declares `gather_block_rows` (a pure row gather such as `ArrayDataset` or
`CachedDataset`): then `K = gather_block_rows // batch_size`, which amortises the
per-element cost of the pipeline and the gather call over `K` batches. The batches
are the same for every `K`.

With `prefetch > 0` grain's iterator reads blocks with a thread pool; without,
the `MapDataset` is indexed directly (grain's iterator bookkeeping costs about as
much as gathering a small batch). The position is one integer — the next batch
of the run — translated to and from the JSON state `{"epoch": e, "index": k, ...}`.

The batches are global: batch `k` of epoch `e` is rows `[k * B, (k + 1) * B)` of the
epoch order (`B = batch_size`), and shard `(i, c)` gathers its contiguous `B / c` of
them, so the position, and the state, are the same on every shard.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.data.datasets._dataset import Batch, gather_batch

from ._grain import import_grain
from ._iterator import BatchIterator
from ._order import epoch_order, order_kind

__all__ = ["MapBatchIterator"]


def block_batches(dataset: Any, batch_size: int) -> int:
    """Batches gathered per pipeline element (`K`) for `dataset`."""
    rows = getattr(dataset, "gather_block_rows", None)
    if isinstance(rows, int) and not isinstance(rows, bool) and rows > batch_size:
        return rows // batch_size
    return 1


class MapBatchIterator(BatchIterator):
    """Batches of an indexable dataset (see the module docs); made by `make_batches`."""

    def __init__(
        self,
        dataset: Any,
        n: int,
        batch_size: int,
        *,
        seed: int,
        shuffle: bool,
        drop_remainder: bool,
        shard: tuple[int, int],
        num_epochs: int | None,
        prefetch: int,
    ) -> None:
        grain = import_grain()
        self.batch_size, self.seed, self.shuffle = batch_size, seed, shuffle
        self.drop_remainder, self.shard, self.num_epochs = drop_remainder, shard, num_epochs
        self.num_samples = n
        self.prefetch = prefetch
        self._dataset = dataset
        self._order_tag = order_kind(dataset, shuffle)[0]
        self._steps = n // batch_size if drop_remainder else -(-n // batch_size)
        self._k = min(block_batches(dataset, self.local_batch_size), self._steps)
        self._blocks = -(-self._steps // self._k)  # blocks per epoch
        get_batch = getattr(dataset, "get_batch", None)
        self._get_batch = (
            get_batch if get_batch is not None else functools.partial(gather_batch, dataset)
        )
        self._orders: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()
        self._pipeline = (
            grain.MapDataset.range(self._blocks).repeat(num_epochs).map_with_index(self._gather)
        )
        self._length = len(self._pipeline)  # blocks in the whole run
        self._next_block = 0  # next block to read when reading without prefetch
        self._iter: Any = None
        if prefetch:
            options = grain.ReadOptions(
                num_threads=min(prefetch, 16), prefetch_buffer_size=prefetch
            )
            self._iter = iter(self._pipeline.to_iter_dataset(options))
        self._block: list[Batch] = []  # the block being handed out
        self._block_id = -1
        self._offset = 0  # batches of `_block` already handed out
        self._skip = 0  # batches to skip in the next block (set_state mid-block)

    @property
    def steps_per_epoch(self) -> int:
        """Batches per epoch (the same on every shard)."""
        return self._steps

    # -- producing blocks --------------------------------------------------------------
    def _epoch_order(self, epoch: int) -> np.ndarray:
        order = self._orders.get(epoch)
        if order is None:
            with self._lock:
                order = self._orders.get(epoch)
                if order is None:
                    order = epoch_order(
                        self._dataset, self.num_samples, self.seed, epoch, self.shuffle
                    )
                    if len(self._orders) >= 2:
                        self._orders.pop(min(self._orders))
                    self._orders[epoch] = order
        return order

    def _shard_rows(self, rows: np.ndarray, count: int) -> np.ndarray:
        """This shard's part of the `count` consecutive global batches in `rows`."""
        index, shards = self.shard
        if shards == 1:
            return rows
        bs, local = self.batch_size, self.local_batch_size
        full = min(count, len(rows) // bs)
        parts = [rows[: full * bs].reshape(full, shards, local)[:, index].ravel()]
        tail = rows[full * bs :]  # a final partial batch (drop_remainder=False)
        if len(tail):
            share = len(tail) // shards
            parts.append(tail[index * share : (index + 1) * share])
        return np.concatenate(parts)

    def _gather(self, block_id: int, block: int) -> list[Batch]:
        order = self._epoch_order(block_id // self._blocks)
        first = block * self._k
        count = min(self._k, self._steps - first)
        bs = self.batch_size
        rows = self._get_batch(self._shard_rows(order[first * bs : (first + count) * bs], count))
        if count == 1:
            return [rows]
        local = self.local_batch_size
        return [{k: v[i * local : (i + 1) * local] for k, v in rows.items()} for i in range(count)]

    def _read_block(self) -> None:
        if self._iter is not None:
            block = next(self._iter)
            block_id = int(self._iter.get_state()["next_index"]) - 1
        else:
            block_id = self._next_block
            if block_id >= self._length:
                raise StopIteration
            block = self._pipeline[block_id]
            self._next_block = block_id + 1
        self._block, self._block_id, self._offset, self._skip = block, block_id, self._skip, 0

    def __next__(self) -> Batch:
        if self._offset >= len(self._block):
            self._read_block()
        batch = self._block[self._offset]
        self._offset += 1
        return batch

    # -- state -------------------------------------------------------------------------
    def _position(self) -> tuple[int, int]:
        if self._offset < len(self._block):
            block_id, offset = self._block_id, self._offset
        elif self._iter is not None:
            block_id, offset = int(self._iter.get_state()["next_index"]), self._skip
        else:
            block_id, offset = self._next_block, self._skip
        epoch, block = divmod(block_id, self._blocks)
        return epoch, block * self._k + offset

    def get_state(self) -> dict[str, Any]:
        """`{"epoch", "index", "num_samples", "order", "seed", "batch_size", ...}` (JSON).

        `epoch` and `index` give the position of the next batch; the other keys
        identify the iterator and are checked by `set_state`.
        """
        epoch, index = self._position()
        return {
            "epoch": epoch,
            "index": index,
            "num_samples": self.num_samples,
            "order": self._order_tag,
            **self._identity(),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Continue from a `get_state()` of an iterator with the same arguments.

        Raises:
            ConfigError: the state is malformed or was saved with other arguments.
        """
        self._check_state(
            state, {"num_samples": self.num_samples, "order": self._order_tag, **self._identity()}
        )
        index = state.get("index", 0)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self._steps:
            raise ConfigError(
                f"`state` has an invalid index: it must lie in [0, {self._steps}). "
                f"Received: index={index!r}."
            )
        if self.num_epochs is not None and state["epoch"] == self.num_epochs and index:
            raise ConfigError(f"`state` is past the end. Received: state={dict(state)!r}.")
        block_id = state["epoch"] * self._blocks + index // self._k
        if self._iter is not None:
            self._iter.set_state({"next_index": block_id})
        else:
            self._next_block = block_id
        self._block, self._block_id, self._offset = [], -1, 0
        self._skip = index % self._k
