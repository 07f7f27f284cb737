"""Epoch orders: a pure function of `(seed, epoch)` (and a dataset's chunk layout)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["chunked_permutation", "epoch_order", "order_kind"]


def chunked_permutation(
    n: int, chunk_size: int, window: int, rng: np.random.Generator
) -> np.ndarray:
    """A shuffle of `range(n)` that reads few chunks at a time.

    The chunks of `chunk_size` rows are permuted, grouped into windows of `window`
    consecutive (permuted) chunks, and the rows are permuted within each window.

    Args:
        n: the number of rows.
        chunk_size: rows per chunk.
        window: chunks per shuffle window.
        rng: the generator (consumed deterministically).

    Returns:
        An int64 permutation of `range(n)`.
    """
    n_chunks = -(-n // chunk_size)
    chunk_order = rng.permutation(n_chunks)
    starts = chunk_order * chunk_size
    lengths = np.minimum(chunk_size, n - starts)
    ends = np.cumsum(lengths)
    rows = np.repeat(starts - (ends - lengths), lengths) + np.arange(n)
    bounds = [0, *ends[window - 1 :: window].tolist()]
    if bounds[-1] != n:
        bounds.append(n)
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        rng.shuffle(rows[a:b])
    return rows.astype(np.int64, copy=False)


def order_kind(dataset: Any, shuffle: bool) -> tuple[str, int, int]:
    """`(tag, chunk_size, window)`: `"sequential"`, `"global"` or `"chunked:CxW"`.

    A dataset declares a chunk-aware shuffle with positive int attributes
    `chunk_size` (rows per chunk) and `shuffle_window` (chunks per window).
    """
    if not shuffle:
        return "sequential", 0, 0
    chunk_size = getattr(dataset, "chunk_size", None)
    window = getattr(dataset, "shuffle_window", None)
    if isinstance(chunk_size, int) and isinstance(window, int) and chunk_size > 0 and window > 0:
        return f"chunked:{chunk_size}x{window}", chunk_size, window
    return "global", 0, 0


def epoch_order(dataset: Any, n: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The sample order of epoch `epoch`: a pure function of `(seed, epoch)` and the dataset.

    Args:
        dataset: the dataset (its optional `chunk_size`/`shuffle_window` select a chunk
            shuffle).
        n: the number of samples.
        seed: the shuffle seed.
        epoch: the epoch index.
        shuffle: False gives `arange(n)`.
    """
    kind, chunk_size, window = order_kind(dataset, shuffle)
    if kind == "sequential":
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng([seed, epoch])
    if kind == "global":
        return rng.permutation(n).astype(np.int64, copy=False)
    return chunked_permutation(n, chunk_size, window, rng)
