"""Batches for `model.fit`, and Keras's native loaders.

`model.fit` pulls `(x, y)` batches from a Python generator (`fit_batches`) over the run's
`Feed` (core's batch iterator: the same order as every other backend for the same seed,
or a native loader's). Keras reads ahead of the step it runs (it peeks at the first
batches to build its data adapter; on accelerators it transfers one batch ahead), so the
feed tracks the data position after every batch it hands out, and the run saves the
position after the last batch trained on.

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
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

import keras
from pipekit_train.core.adapter import ConfigError

__all__ = [
    "PyDatasetBatches",
    "check_native",
    "fit_batches",
    "is_native_loader",
    "native_batches",
    "native_eval_batches",
]


def fit_batches(
    batches: Iterator[Mapping[str, Any]], *, rollout: bool = False
) -> Iterator[tuple[Any, Any]]:
    """`(x, y)` forever for `model.fit`, from the run's batches (core's `Feed`, which
    repeats epochs and remembers the data position after each batch).

    With `rollout` the input noise of core's feed (`batch["noise"]`) travels in `y`
    (`_rollout.rollout_targets`): Keras hands `y` to the loss only."""
    if rollout:
        from ._rollout import rollout_inputs, rollout_targets

        while True:
            batch = next(batches)
            yield rollout_inputs(batch), rollout_targets(batch)
    while True:
        batch = next(batches)
        yield batch["x"], batch["y"]


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
