"""Feed core's batch iterator (or a native loader's) to `model.fit` and know its state.

`model.fit` pulls batches from a Python generator over core's `BatchIterator` (the same
order as every other backend for the same seed). Keras reads ahead of the step it runs
(it peeks at the first batches to build its data adapter; on accelerators it transfers
one batch ahead), so the iterator's live state is ahead of training. `FitFeed` records
the iterator state after every batch it hands out and answers "what was the state after
the first `n` batches", which is what a checkpoint at step `start + n` must hold.

Native loaders: a `keras.utils.PyDataset` is iterated here, in this process (its
`workers`/`use_multiprocessing` are not used), by `PyDatasetBatches`, whose position is
`(epoch, index)`. A resume builds the position again by calling `on_epoch_begin` /
`on_epoch_end` once per finished epoch, so it is exact when a batch depends only on its
index and on how many epochs ended (e.g. `on_epoch_end` reshuffles with an RNG seeded in
`__init__`); an unseeded RNG is not reproducible. A `tf.data.Dataset` (only where
TensorFlow is installed and imported) is repeated; it has no checkpointable position, so
a resume starts it again from its beginning.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

import keras
from pipekit_train.core import ConfigError

__all__ = [
    "FitFeed",
    "PyDatasetBatches",
    "check_native",
    "is_native_loader",
    "native_batches",
    "native_eval_batches",
]

# Batches Keras may take ahead of the step it runs (peeked batches + device look-ahead).
_MAX_AHEAD = 64


class FitFeed:
    """An endless `(x, y)` generator over a core `BatchIterator`, with per-batch states.

    Args:
        batches: the core batch iterator (positioned at the resume point).
        capacity: the most consecutive steps Keras runs between two callbacks.
    """

    def __init__(self, batches: Any, capacity: int = 1):
        self.batches = batches
        self.produced = 0
        self._states: deque[tuple[int, dict[str, Any] | None]] = deque(maxlen=capacity + _MAX_AHEAD)
        get_state = getattr(batches, "get_state", None)
        self._get_state = get_state if callable(get_state) else (lambda: None)
        self._states.append((0, self._get_state()))

    def generator(self) -> Iterator[tuple[Any, Any]]:
        """Yield `(x, y)` forever (core iterators repeat epochs)."""
        batches, states, get_state = self.batches, self._states, self._get_state
        while True:
            batch = next(batches)
            self.produced += 1
            states.append((self.produced, get_state()))
            yield batch["x"], batch["y"]

    def state_after(self, consumed: int) -> dict[str, Any] | None:
        """The iterator state after the first `consumed` batches (None: not checkpointable)."""
        for n, state in reversed(self._states):
            if n == consumed:
                return state
        raise RuntimeError(
            f"pipekit-train-keras lost track of the data iterator state after {consumed} "
            f"batches (Keras read more than {_MAX_AHEAD} batches ahead). Please report this."
        )


# -- native loaders ------------------------------------------------------------------------


def _is_tf_dataset(data: Any) -> bool:
    tf = sys.modules.get("tensorflow")  # a tf.data.Dataset means TensorFlow was imported
    data_mod = getattr(tf, "data", None)
    return data_mod is not None and isinstance(data, data_mod.Dataset)


def is_native_loader(data: Any) -> bool:
    """Whether `data` is a `keras.utils.PyDataset` (or a `tf.data.Dataset`, with TensorFlow)."""
    return isinstance(data, keras.utils.PyDataset) or _is_tf_dataset(data)


def _as_batch(element: Any, name: str) -> dict[str, np.ndarray]:
    if isinstance(element, Mapping) and "x" in element and "y" in element:
        x, y = element["x"], element["y"]
    elif isinstance(element, (tuple, list)) and len(element) == 2:
        x, y = element
    else:
        what = (
            sorted(element)
            if isinstance(element, Mapping)
            else f"{type(element).__name__} of {len(element)}"
            if isinstance(element, (tuple, list))
            else type(element).__name__
        )
        raise ConfigError(
            f"`{name}` must yield `(x, y)` batches (or dicts with 'x' and 'y'). Received: "
            f"element={what}. Return `(inputs, targets)` from __getitem__ (sample weights are "
            "not supported)."
        )
    return {"x": keras.ops.convert_to_numpy(x), "y": keras.ops.convert_to_numpy(y)}


def _num_batches(data: Any) -> int | None:
    try:
        n = data.num_batches
    except NotImplementedError:
        return None
    return None if n is None else int(n)


def check_native(data: Any, name: str) -> None:
    """Refuse a `PyDataset` without batches or whose first batch is not `(x, y)`."""
    if not isinstance(data, keras.utils.PyDataset):
        return
    n = _num_batches(data)
    if n == 0:
        raise ConfigError(f"`{name}` is an empty PyDataset. Received: num_batches=0.")
    if n is None and name == "validation":
        raise ConfigError(
            "A validation PyDataset must be finite (define `__len__`). Received: "
            "validation.num_batches=None."
        )
    _as_batch(data[0], name)


class PyDatasetBatches:
    """Endless numpy batches from a `keras.utils.PyDataset`, position `(epoch, index)`.

    Args:
        data: the PyDataset (`__getitem__(i) -> (x, y)` batches).
        state: a `get_state()` of an earlier iterator over a fresh copy of the same
            PyDataset (a resume): `on_epoch_begin`/`on_epoch_end` are replayed once per
            finished epoch, then iteration continues at `index`.
    """

    def __init__(self, data: Any, state: Mapping[str, Any] | None = None):
        self.data = data
        self.epoch = 0
        self.index = 0
        self._size = _num_batches(data)
        if state:
            self.set_state(state)
        data.on_epoch_begin()

    def __iter__(self) -> PyDatasetBatches:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self._size is not None and self.index >= self._size:
            self.data.on_epoch_end()
            self.epoch += 1
            self.index = 0
            self.data.on_epoch_begin()
        batch = _as_batch(self.data[self.index], "data")
        self.index += 1
        return batch

    def get_state(self) -> dict[str, Any]:
        """`{"epoch": e, "index": i}`: the next batch is `data[i]` of epoch `e`."""
        return {"epoch": self.epoch, "index": self.index}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Position a fresh iterator (replays the epoch hooks of the finished epochs)."""
        epoch = int(state.get("epoch", 0))
        for _ in range(epoch - self.epoch):
            self.data.on_epoch_begin()
            self.data.on_epoch_end()
        self.epoch, self.index = epoch, int(state.get("index", 0))


class _TFBatches:
    """A repeated `tf.data.Dataset` as numpy batches (no checkpointable position)."""

    def __init__(self, data: Any):
        self._it = data.repeat().as_numpy_iterator()

    def __iter__(self) -> _TFBatches:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        return _as_batch(next(self._it), "data")


def native_batches(data: Any, state: Mapping[str, Any] | None) -> Any:
    """The training batches of a native loader, positioned by `state` where possible."""
    if isinstance(data, keras.utils.PyDataset):
        return PyDatasetBatches(data, state)
    return _TFBatches(data)


def native_eval_batches(data: Any) -> Iterator[dict[str, np.ndarray]]:
    """One pass over a native validation loader."""
    if isinstance(data, keras.utils.PyDataset):
        size = _num_batches(data) or 0
        for i in range(size):
            yield _as_batch(data[i], "validation")
        return
    for element in data.as_numpy_iterator():
        yield _as_batch(element, "validation")
