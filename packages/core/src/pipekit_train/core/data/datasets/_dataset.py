"""The dataset contract and the in-memory datasets: `Dataset`, `ArrayDataset`, `IterableDataset`.

A *sample* is a `dict[str, np.ndarray]` (inputs under `"x"`, targets under `"y"` by
convention); a *batch* is the same dict with a leading batch axis. Every concrete
dataset in `pipekit_train.core.data` also offers `get_batch(indices)` (one gather per
batch instead of one call per row), `keys`, `element_spec` and `fingerprint()`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, runtime_checkable

import numpy as np

from pipekit_train.core._errors import ConfigError

from ._hashing import Hasher, fingerprint_callable

__all__ = [
    "is_core_dataset",
    "is_stream",
    "ArrayDataset",
    "ArraySpec",
    "Batch",
    "Dataset",
    "IterableDataset",
    "Sample",
    "block_rows",
    "gather_batch",
]

Sample: TypeAlias = dict[str, np.ndarray]
"""One sample: a dict of numpy arrays (inputs under `"x"`, targets under `"y"`)."""

Batch: TypeAlias = dict[str, np.ndarray]
"""A batch: a sample dict whose arrays carry a leading batch axis."""

_NUMERIC_KINDS = frozenset("biufc")  # bool, signed, unsigned, float, complex


@dataclass(frozen=True)
class ArraySpec:
    """The shape (without the batch axis) and dtype of one key of a sample.

    Attributes:
        shape: the per-sample shape, e.g. `(8,)` for 8 features.
        dtype: the numpy dtype.
    """

    shape: tuple[int, ...]
    dtype: np.dtype

    def to_json(self) -> dict[str, Any]:
        """`{"shape": [...], "dtype": "<f4"}` (JSON)."""
        return {"shape": list(self.shape), "dtype": np.dtype(self.dtype).str}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ArraySpec:
        """Inverse of `to_json`."""
        return cls(tuple(int(d) for d in data["shape"]), np.dtype(data["dtype"]))


@runtime_checkable
class Dataset(Protocol):
    """An indexable dataset: `len(ds)` samples, `ds[i]` returns sample `i`.

    Concrete datasets also implement `get_batch(indices) -> batch`, `keys`,
    `element_spec` and `fingerprint()`; the batching engine falls back to stacking
    `__getitem__` results (`gather_batch`) for datasets that only have the two
    methods of this protocol.
    """

    def __len__(self) -> int:
        """The number of samples."""
        ...

    def __getitem__(self, index: int) -> Sample:
        """Sample `index` as a dict of numpy arrays."""
        ...


_BLOCK_BYTES = 4 << 20
_BLOCK_ROWS_MAX = 8192


def block_rows(spec: Mapping[str, ArraySpec]) -> int:
    """Rows the batching engine may gather at once: about 4 MiB, at most 8192 rows."""
    row_bytes = sum(
        max(1, int(np.prod(s.shape, dtype=np.int64))) * s.dtype.itemsize for s in spec.values()
    )
    return int(min(_BLOCK_ROWS_MAX, max(1, _BLOCK_BYTES // max(1, row_bytes))))


def check_key(key: Any, *, field: str) -> str:
    """Validate a sample key (a non-empty string usable as a zarr array name)."""
    if not isinstance(key, str) or not key or "/" in key or key.startswith(("_pipekit", ".")):
        raise ConfigError(
            f"`{field}` keys must be non-empty strings without '/' that do not start with "
            f"'.' or '_pipekit'. Received: key={key!r}. Rename the key, e.g. 'x' or 'y'."
        )
    return key


def check_numeric(key: str, array: np.ndarray, *, where: str) -> None:
    """Raise a `ConfigError` unless `array` has a numeric or bool dtype."""
    if array.dtype.kind not in _NUMERIC_KINDS:
        raise ConfigError(
            f"`{key}` must be a numeric or bool array ({where}). Received: {key}.dtype="
            f"{array.dtype} (kind {array.dtype.kind!r}). Convert it to a numeric dtype first "
            "(object arrays and strings cannot be batched or cached)."
        )


def as_sample(value: Any, *, where: str) -> Sample:
    """Convert a mapping of array-likes to a sample dict, validating keys and dtypes."""
    if not isinstance(value, Mapping) or not value:
        raise ConfigError(
            f"A sample must be a non-empty dict of arrays ({where}). "
            f"Received: sample={type(value).__name__}. Return e.g. {{'x': x, 'y': y}}."
        )
    out: Sample = {}
    for key, v in value.items():
        check_key(key, field="sample")
        arr = np.asarray(v)
        check_numeric(key, arr, where=where)
        out[key] = arr
    return out


def spec_of(sample: Mapping[str, np.ndarray]) -> dict[str, ArraySpec]:
    """The element spec (shape and dtype per key) of one sample."""
    return {k: ArraySpec(tuple(np.shape(v)), np.asarray(v).dtype) for k, v in sample.items()}


def stack_samples(samples: list[Sample], spec: Mapping[str, ArraySpec] | None = None) -> Batch:
    """Stack samples into a batch, with a clear error if their keys or shapes differ."""
    if not samples:
        raise ConfigError("Cannot stack an empty list of samples into a batch.")
    first = samples[0]
    keys = list(first)
    out: Batch = {}
    for key in keys:
        try:
            parts = [s[key] for s in samples]
        except KeyError as exc:
            raise ConfigError(
                f"Samples must all have the same keys. Received: a sample without key {key!r}; "
                f"the first sample has keys {keys}."
            ) from exc
        try:
            out[key] = np.stack(parts)
        except ValueError as exc:
            shapes = sorted({tuple(np.shape(p)) for p in parts})
            raise ConfigError(
                f"Samples must have the same shape per key to be batched. Received: key "
                f"{key!r} with shapes {shapes}. Pad or resize samples to one shape."
            ) from exc
        if spec is not None and key in spec and out[key].dtype != spec[key].dtype:
            out[key] = out[key].astype(spec[key].dtype)
    return out


def gather_batch(dataset: Any, indices: np.ndarray) -> Batch:
    """Gather the samples at `indices` into a batch.

    Uses `dataset.get_batch(indices)` when the dataset has it (one gather per batch),
    otherwise stacks `dataset[i]` for each index.

    Args:
        dataset: any indexable dataset.
        indices: a 1-D integer array of sample indices.

    Returns:
        A batch dict whose arrays have a leading axis of `len(indices)`.
    """
    get_batch = getattr(dataset, "get_batch", None)
    if get_batch is not None:
        return get_batch(indices)
    return stack_samples([as_sample(dataset[int(i)], where="dataset[i]") for i in indices])


class ArrayDataset:
    """An in-memory dataset of numpy arrays with equal leading lengths.

    Sample `i` is `{key: array[i] for key, array in arrays}`. The arrays are held as
    given (no copy) and treated as immutable: changing them changes the fingerprint.

    Args:
        **arrays: at least one numeric or bool array (array-likes are converted with
            `np.asarray`), all with the same length along axis 0.

    Raises:
        ConfigError: no arrays, a 0-d array, a non-numeric dtype, or unequal lengths.

    Examples:
        >>> import numpy as np
        >>> from pipekit_train.core.data import ArrayDataset
        >>> ds = ArrayDataset(x=np.zeros((100, 8), np.float32), y=np.zeros((100, 1)))
        >>> ds.get_batch(np.array([3, 1]))["x"].shape
        (2, 8)
    """

    def __init__(self, **arrays: Any) -> None:
        if not arrays:
            raise ConfigError(
                "`ArrayDataset` needs at least one array. Received: no arrays. "
                "Pass them by key, e.g. ArrayDataset(x=x, y=y)."
            )
        converted: dict[str, np.ndarray] = {}
        length: int | None = None
        first_key = ""
        for key, value in arrays.items():
            check_key(key, field="ArrayDataset")
            arr = np.asarray(value)
            check_numeric(key, arr, where="ArrayDataset")
            if arr.ndim == 0:
                raise ConfigError(
                    f"`{key}` must have a leading sample axis. Received: {key} with shape (). "
                    f"Use e.g. np.reshape({key}, (-1, 1))."
                )
            if length is None:
                length, first_key = arr.shape[0], key
            elif arr.shape[0] != length:
                raise ConfigError(
                    f"All arrays of an `ArrayDataset` must have the same length along axis 0. "
                    f"Received: {key}.shape[0]={arr.shape[0]}, but {first_key}.shape[0]={length}. "
                    "Trim or pad them to one length."
                )
            converted[key] = arr
        self._arrays = converted
        self._length = int(length or 0)

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """The underlying arrays (a new dict; the arrays themselves are not copied)."""
        return dict(self._arrays)

    @property
    def keys(self) -> tuple[str, ...]:
        """The sample keys, in insertion order."""
        return tuple(self._arrays)

    @property
    def element_spec(self) -> dict[str, ArraySpec]:
        """Shape (without the sample axis) and dtype per key."""
        return {k: ArraySpec(a.shape[1:], a.dtype) for k, a in self._arrays.items()}

    @property
    def gather_block_rows(self) -> int:
        """Rows `make_batches` may gather in one call (a pure row gather; ~4 MiB)."""
        return block_rows(self.element_spec)

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> Sample:
        i = int(index)
        if not -self._length <= i < self._length:
            raise IndexError(f"index {index} is out of range for a dataset of {self._length}")
        return {k: a[i] for k, a in self._arrays.items()}

    def get_batch(self, indices: np.ndarray) -> Batch:
        """Gather the rows at `indices` of every array (one numpy gather per key)."""
        idx = np.asarray(indices, dtype=np.intp)
        return {k: a.take(idx, axis=0) for k, a in self._arrays.items()}

    def fingerprint(self) -> str:
        """SHA-256 hex digest of the keys, dtypes, shapes and bytes of the arrays."""
        h = Hasher("ArrayDataset")
        for key in sorted(self._arrays):
            h.update_json(key)
            h.update_array(self._arrays[key])
        return h.hexdigest()

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}={a.dtype}{list(a.shape)}" for k, a in self._arrays.items())
        return f"ArrayDataset({parts})"


class IterableDataset:
    """A stream of samples with no length (a generator, a file reader, a live simulator).

    `source` is called with no arguments each time a fresh pass is needed and must
    return a new iterator over the same samples in the same order, so that a stream
    can be restarted deterministically; a resume skips the samples already consumed.

    Args:
        source: a zero-argument callable returning an iterator of sample dicts.

    Raises:
        ConfigError: `source` is not callable (e.g. a generator object was passed
            instead of the generator function).

    Examples:
        >>> import numpy as np
        >>> from pipekit_train.core.data import IterableDataset
        >>> def samples():
        ...     for i in range(10):
        ...         yield {"x": np.full(3, i, np.float32), "y": np.float32(i)}
        >>> stream = IterableDataset(samples)
    """

    def __init__(self, source: Callable[[], Iterator[Mapping[str, Any]]]) -> None:
        if not callable(source):
            raise ConfigError(
                "`source` must be a zero-argument callable returning a fresh iterator, so the "
                f"stream can be restarted. Received: source={type(source).__name__}. Pass the "
                "generator function itself (or `lambda: iter(items)`), not an iterator."
            )
        self.source = source
        self._spec: dict[str, ArraySpec] | None = None

    def __iter__(self) -> Iterator[Sample]:
        for i, sample in enumerate(self.source()):
            yield as_sample(sample, where=f"stream sample {i}")

    def _first(self) -> Sample:
        for sample in itertools.islice(iter(self), 1):
            return sample
        raise ConfigError(
            "The stream is empty: `source()` returned an iterator without samples. "
            "Check the source yields at least one sample dict."
        )

    @property
    def element_spec(self) -> dict[str, ArraySpec]:
        """Shape and dtype per key, read from the first sample of a fresh pass."""
        if self._spec is None:
            self._spec = spec_of(self._first())
        return dict(self._spec)

    @property
    def keys(self) -> tuple[str, ...]:
        """The sample keys (from the first sample)."""
        return tuple(self.element_spec)

    def fingerprint(self) -> str:
        """SHA-256 of the source's name/config and the first sample (best effort)."""
        h = Hasher("IterableDataset")
        h.update_json(fingerprint_callable(self.source))
        h.update_sample(self._first())
        return h.hexdigest()

    def __repr__(self) -> str:
        return f"IterableDataset({fingerprint_callable(self.source)!r})"


def is_core_dataset(data: Any) -> bool:
    """Whether `data` is a pipekit dataset: indexable (`__len__`, `__getitem__`,
    `get_batch`) or a core `IterableDataset` stream — not a framework's native loader."""
    if isinstance(data, IterableDataset):
        return True
    return hasattr(data, "__len__") and hasattr(data, "__getitem__") and hasattr(data, "get_batch")


def is_stream(data: Any) -> bool:
    """Whether `data` is a core `IterableDataset` (a stream without a length)."""
    return isinstance(data, IterableDataset)
