"""The batching engine every adapter uses: `make_batches` over grain's `MapDataset`.

The pipeline is batch-level (`MapBatchIterator`): a grain `MapDataset` of whole
batches — or blocks of consecutive batches gathered in one call — never of records
(per-record grain pipelines are two orders of magnitude slower for small rows).
The position is one integer, translated to and from the pure-JSON state
`{"epoch": e, "index": k, ...}`.

Epoch `e`'s order is a pure function of `(seed, e)`:
`np.random.default_rng([seed, e]).permutation(n)`, or for a dataset that declares
a chunk-aware order (`chunk_size` and `shuffle_window` attributes, e.g. an
out-of-core `CachedDataset`) a chunk shuffle: the chunks are permuted, grouped into
windows of `shuffle_window` chunks, and rows are permuted within each window.
Batches are global: batch `k` is rows `[k * B, (k + 1) * B)` of that order
(`B = batch_size`, the global batch), and shard `(i, c)` takes the contiguous part
`[i * B / c, (i + 1) * B / c)` of every batch. The order and the iterator state do
not depend on the number of shards, so a run checkpointed with `c` processes resumes
with any other number that divides `B` and continues the same sample sequence.
"""

from __future__ import annotations

from typing import Any, TypedDict

import numpy as np

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.data.datasets._dataset import IterableDataset

from ._iterator import BatchIterator
from ._map_iterator import MapBatchIterator
from ._order import chunked_permutation, epoch_order

__all__ = ["chunked_permutation", "epoch_order", "make_batches"]


class _IteratorOptions(TypedDict):
    """The keyword arguments `make_batches` passes to both batch iterators."""

    seed: int
    shuffle: bool
    drop_remainder: bool
    shard: tuple[int, int]
    num_epochs: int | None


def _check_int(name: str, value: Any, minimum: int, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        kind = "positive int" if minimum == 1 else f"int >= {minimum}"
        raise ConfigError(f"`{name}` must be a {kind}. Received: {name}={value!r}. {hint}")
    return int(value)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def make_batches(
    dataset: Any,
    batch_size: int,
    *,
    seed: int = 0,
    shuffle: bool = True,
    drop_remainder: bool = True,
    shard: tuple[int, int] = (0, 1),
    num_epochs: int | None = None,
    prefetch: int = 0,
) -> BatchIterator:
    """Turn a dataset into a checkpointable iterator of numpy batches.

    For an indexable dataset epoch `e` reads the samples in the order
    `np.random.default_rng([seed, e]).permutation(n)` — a pure function of
    `(seed, e)`, so epochs are reshuffled and every backend sees the same batches.

    `batch_size` is the global batch. With `shard=(i, c)` (data-parallel
    processes) every batch of that order is split into `c` contiguous parts and
    shard `i` yields part `i` (`batch_size // c` rows): the processes together
    train on exactly the batches of a one-process run. The order, `steps_per_epoch`
    and the state are the same on every shard and for every shard count, so a state
    saved with `c` shards resumes an iterator with any other count (elastic resume).

    For an `IterableDataset` consecutive samples are batched in source order
    (`shuffle` has no effect: shuffle in the source), split over shards the same
    way, and the state counts the samples consumed.

    Optional dataset hooks:

    - `chunk_size` and `shuffle_window` (positive ints, e.g. an out-of-core
      `CachedDataset`): a chunk-aware shuffle replaces the permutation — chunks are
      permuted, grouped into windows of `shuffle_window` chunks, and rows permuted
      within each window (still a pure function of `(seed, e)`).
    - `gather_block_rows` (an int, for a `get_batch` that is a pure row gather such
      as `ArrayDataset`'s): up to that many rows — several consecutive batches — are
      gathered in one call and sliced, which amortises per-call overhead. The
      batches are the same.

    Args:
        dataset: an indexable dataset (`len`, `[i]`, ideally `get_batch`) or an
            `IterableDataset`.
        batch_size: samples per global batch (positive int; a multiple of the shard
            count).
        seed: non-negative shuffle seed.
        shuffle: shuffle each epoch (indexable datasets only).
        drop_remainder: drop the final partial batch of each epoch. With False
            the last batch of an epoch may be smaller.
        shard: `(index, count)` of this process among `count` data-parallel processes:
            it yields rows `[index * b, (index + 1) * b)` of every global batch, with
            `b = batch_size // count`.
        num_epochs: the number of epochs; None repeats forever.
        prefetch: gathers (batches, or blocks of batches) prepared ahead in background
            threads (0: none); useful for slow `get_batch`, e.g. simulation or
            out-of-core and remote caches.

    Returns:
        A `BatchIterator`.

    Raises:
        ConfigError: an argument is invalid, `batch_size` does not split over the
            shards, or `batch_size` exceeds the samples while `drop_remainder=True`.

    Examples:
        >>> import numpy as np
        >>> from pipekit_train.core.data import ArrayDataset, make_batches
        >>> x, y = np.zeros((1000, 8), np.float32), np.zeros((1000, 1), np.float32)
        >>> it = make_batches(ArrayDataset(x=x, y=y), 256, seed=0)
        >>> batch = next(it)
        >>> batch["x"].shape, it.steps_per_epoch
        ((256, 8), 3)
        >>> state = it.get_state()                  # JSON, goes into a checkpoint
        >>> val_ds = ArrayDataset(x=x[:300], y=y[:300])
        >>> val = make_batches(val_ds, 256, shuffle=False, drop_remainder=False,
        ...                    num_epochs=1)        # one pass, last batch partial
        >>> [b["x"].shape[0] for b in val]
        [256, 44]
    """
    batch_size = _check_int("batch_size", batch_size, 1, "Use e.g. batch_size=32.")
    seed = _check_int("seed", seed, 0, "Use e.g. seed=0.")
    for name, flag in (("shuffle", shuffle), ("drop_remainder", drop_remainder)):
        if not isinstance(flag, (bool, np.bool_)):
            raise ConfigError(f"`{name}` must be a bool. Received: {name}={flag!r}.")
    if (
        not isinstance(shard, (tuple, list))
        or len(shard) != 2
        or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in shard)
        or shard[1] < 1
        or not 0 <= shard[0] < shard[1]
    ):
        raise ConfigError(
            "`shard` must be (index, count) with 0 <= index < count. "
            f"Received: shard={shard!r}. Use e.g. shard=(process_index, process_count)."
        )
    shard_t = (int(shard[0]), int(shard[1]))
    if batch_size % shard_t[1]:
        raise ConfigError(
            f"`batch_size` is the global batch and must split evenly over the {shard_t[1]} "
            f"shards (processes). Received: batch_size={batch_size}, shard={shard_t!r}. "
            f"Use a multiple of {shard_t[1]}, e.g. batch_size={_round_up(batch_size, shard_t[1])}."
        )
    if num_epochs is not None:
        num_epochs = _check_int(
            "num_epochs", num_epochs, 1, "Use a positive number of epochs or None for endless."
        )
    prefetch = _check_int("prefetch", prefetch, 0, "Use e.g. prefetch=2 (0 disables it).")
    options = _IteratorOptions(
        seed=seed,
        shuffle=bool(shuffle),
        drop_remainder=bool(drop_remainder),
        shard=shard_t,
        num_epochs=num_epochs,
    )
    if isinstance(dataset, IterableDataset):
        from ._stream import StreamBatchIterator

        return StreamBatchIterator(dataset, batch_size, **options)
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise ConfigError(
            "`dataset` must be indexable (`len()` and `[i]`) or an `IterableDataset`. "
            f"Received: dataset={type(dataset).__name__}. Wrap a stream as "
            "IterableDataset(lambda: iter(samples)) or arrays as ArrayDataset(x=x, y=y)."
        )
    n = len(dataset)
    if n == 0:
        raise ConfigError(
            "`dataset` is empty. Received: a dataset with 0 samples. Batch a non-empty dataset."
        )
    if drop_remainder and batch_size > n:
        raise ConfigError(
            "`batch_size` must not exceed the number of samples when drop_remainder=True. "
            f"Received: batch_size={batch_size}, but the dataset has {n} samples. "
            f"Use batch_size <= {n} or drop_remainder=False."
        )
    last = n % batch_size
    if not drop_remainder and last % shard_t[1]:
        raise ConfigError(
            f"With drop_remainder=False the last batch of every epoch holds {last} samples, "
            f"which do not split evenly over the {shard_t[1]} shards (processes). Received: "
            f"batch_size={batch_size}, {n} samples, shard={shard_t!r}. Use "
            "drop_remainder=True, or a batch_size that leaves a remainder divisible by "
            f"{shard_t[1]}."
        )
    return MapBatchIterator(dataset, n, batch_size, prefetch=prefetch, **options)
