"""`split` and `Subset`: deterministic views of a dataset."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError

from ._dataset import ArraySpec, Batch, Sample, gather_batch, spec_of
from ._hashing import Hasher

__all__ = ["Subset", "split"]

_SPLIT_TAG = 0x53504C54  # "SPLT": keeps split permutations apart from epoch permutations
_TOLERANCE = 1e-6


class Subset:
    """A view of `dataset` holding the samples at `indices` (in that order).

    `get_batch` maps the indices and delegates to the parent's `get_batch`, so a
    subset of an in-memory or cached dataset keeps its fast gather.

    Args:
        dataset: an indexable dataset.
        indices: 1-D integer indices into `dataset` (each in `[0, len(dataset))`).

    Raises:
        ConfigError: `indices` is not 1-D integer or has an out-of-range index.
    """

    def __init__(self, dataset: Any, indices: Sequence[int] | np.ndarray) -> None:
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise ConfigError(
                "`dataset` must be indexable (`len()` and `[i]`). "
                f"Received: dataset={type(dataset).__name__}."
            )
        idx = np.asarray(indices)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise ConfigError(
                "`indices` must be a 1-D array of ints. "
                f"Received: indices with shape {idx.shape} and dtype {idx.dtype}."
            )
        idx = idx.astype(np.int64)
        n = len(dataset)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = int(idx.min() if idx.min() < 0 else idx.max())
            raise ConfigError(
                f"`indices` must lie in [0, {n}). Received: index {bad} for a dataset of {n} "
                "samples."
            )
        self.dataset = dataset
        self.indices = idx
        self.indices.setflags(write=False)

    def __len__(self) -> int:
        return int(self.indices.size)

    def __getitem__(self, index: int) -> Sample:
        i = int(index)
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {index} is out of range for a subset of {len(self)}")
        return self.dataset[int(self.indices[i])]

    def get_batch(self, indices: np.ndarray) -> Batch:
        """Gather through the parent's `get_batch` at the mapped indices."""
        return gather_batch(self.dataset, self.indices[np.asarray(indices, dtype=np.intp)])

    @property
    def gather_block_rows(self) -> int | None:
        """The parent's `gather_block_rows` (None if it has none)."""
        return getattr(self.dataset, "gather_block_rows", None)

    @property
    def element_spec(self) -> dict[str, ArraySpec]:
        """The parent's element spec."""
        spec = getattr(self.dataset, "element_spec", None)
        return dict(spec) if spec is not None else spec_of(self[0])

    @property
    def keys(self) -> tuple[str, ...]:
        """The parent's sample keys."""
        return tuple(self.element_spec)

    def fingerprint(self) -> str:
        """SHA-256 of the parent's fingerprint and the indices."""
        parent = getattr(self.dataset, "fingerprint", None)
        h = Hasher("Subset")
        h.update_json(parent() if callable(parent) else type(self.dataset).__name__)
        h.update_array(self.indices)
        return h.hexdigest()

    def __repr__(self) -> str:
        return f"Subset({self.dataset!r}, {len(self)} of {len(self.dataset)})"


def split(dataset: Any, fractions: Sequence[float], seed: int = 0) -> tuple[Subset, ...]:
    """Split `dataset` into disjoint, deterministic random subsets.

    The samples are permuted with `np.random.default_rng([seed, 0x53504C54])` and cut
    into consecutive parts of `floor(f * n)` samples. When the fractions sum to 1 the
    few samples left by rounding go to the first parts, one each, so every sample
    is used; when they sum to less than 1 the rest is left out.

    Args:
        dataset: an indexable dataset.
        fractions: positive fractions, e.g. `(0.8, 0.1, 0.1)`, summing to at most 1.
        seed: a non-negative int; the same seed gives the same split.

    Returns:
        One `Subset` per fraction.

    Raises:
        ConfigError: a fraction is not positive, they sum to more than 1, or a part
            would be empty.

    Examples:
        >>> import numpy as np
        >>> from pipekit_train.core.data import ArrayDataset, split
        >>> ds = ArrayDataset(x=np.zeros((100, 8), np.float32), y=np.zeros((100, 1), np.float32))
        >>> train, val = split(ds, (0.9, 0.1), seed=0)
        >>> len(train), len(val)
        (90, 10)
    """
    if isinstance(fractions, (int, float)) or not isinstance(fractions, Sequence) or not fractions:
        raise ConfigError(
            "`fractions` must be a non-empty sequence of positive floats. "
            f"Received: fractions={fractions!r}. Use e.g. fractions=(0.8, 0.2)."
        )
    fracs = []
    for f in fractions:
        if (
            isinstance(f, bool)
            or not isinstance(f, (int, float, np.floating, np.integer))
            or not (math.isfinite(float(f)) and float(f) > 0)
        ):
            raise ConfigError(
                "`fractions` must all be positive. "
                f"Received: fractions={list(fractions)!r}. Use e.g. fractions=(0.8, 0.2)."
            )
        fracs.append(float(f))
    total = sum(fracs)
    if total > 1 + _TOLERANCE:
        raise ConfigError(
            f"`fractions` must sum to at most 1. Received: fractions={list(fractions)!r} "
            f"(sum {total:.6g}). Scale them down, e.g. (0.8, 0.2)."
        )
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"`seed` must be a non-negative int. Received: seed={seed!r}.")
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise ConfigError(
            "`dataset` must be indexable (`len()` and `[i]`); streams cannot be split. "
            f"Received: dataset={type(dataset).__name__}."
        )
    n = len(dataset)
    sizes = [math.floor(f * n + 1e-9) for f in fracs]
    if abs(total - 1) <= _TOLERANCE:
        for i in range(n - sum(sizes)):
            sizes[i % len(sizes)] += 1
    for i, size in enumerate(sizes):
        if size == 0:
            raise ConfigError(
                f"`fractions` gives an empty part. Received: fractions={list(fractions)!r}, "
                f"so part {i} has 0 of the {n} samples. Use larger fractions or more data."
            )
    perm = np.random.default_rng([int(seed), _SPLIT_TAG]).permutation(n)
    bounds = np.cumsum([0, *sizes])
    return tuple(Subset(dataset, perm[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True))
