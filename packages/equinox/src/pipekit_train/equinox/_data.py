"""grain loaders as native data for the Equinox adapter.

Accepted (`is_native_loader`): a `grain.MapDataset`, a `grain.IterDataset` and a
`grain.DataLoader` whose elements are already-batched dicts of numpy arrays with `"x"` and
`"y"` (e.g. `grain.MapDataset.source(samples).shuffle(seed=0).batch(32, drop_remainder=True)`).

Training batches (`native_batches`, a `GrainBatches`) run without end: a `MapDataset` is
repeated (`ds.repeat().to_iter_dataset()`: its own shuffle, seeded by you, decides each
epoch's order); an `IterDataset` or a `DataLoader` that ends is iterated again from its
start (a new epoch). The position is grain's own iterator state plus the epoch,
JSON-encoded (bytes as text), so a checkpoint holds it and a resume continues with
exactly the batches an uninterrupted run would have seen. Validation
(`native_eval_batches`) is one pass in order.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import grain
import numpy as np

from pipekit_train.core.adapter import ConfigError

__all__ = ["GrainBatches", "is_native_loader", "native_batches", "native_eval_batches"]

_LOADERS = (grain.MapDataset, grain.IterDataset, grain.DataLoader)
_BYTES = "__bytes_b64__"


def is_native_loader(data: Any) -> bool:
    """Whether `data` is a grain `MapDataset`, `IterDataset` or `DataLoader`."""
    return isinstance(data, _LOADERS)


def check_first_batch(data: Any, name: str) -> None:
    """For a `MapDataset` (cheap random access): its elements must be batch dicts."""
    if isinstance(data, grain.MapDataset):
        if len(data) == 0:
            raise ConfigError(f"`{name}` is an empty grain MapDataset. Received: len({name})=0.")
        if name == "validation" and len(data) >= sys.maxsize:
            raise ConfigError(
                "A validation MapDataset must be finite. Received: validation=a repeated "
                "MapDataset. Drop its .repeat()."
            )
        _as_batch(data[0], name)


def _as_batch(element: Any, name: str) -> dict[str, np.ndarray]:
    if not isinstance(element, Mapping) or "x" not in element or "y" not in element:
        keys = sorted(element) if isinstance(element, Mapping) else type(element).__name__
        raise ConfigError(
            f"`{name}` must yield batches: dicts of arrays with an input under 'x' and a target "
            f"under 'y', a leading batch axis on each. Received: element={keys}. "
            "Map your records to {'x': ..., 'y': ...} and batch them, e.g. ds.map(f).batch(32)."
        )
    return {str(k): np.asarray(v) for k, v in element.items()}


def _encode(value: Any) -> Any:
    """A grain iterator state as JSON: bytes become `{"__bytes_b64__": "..."}`."""
    if isinstance(value, bytes):
        try:  # a DataLoader's state is JSON text
            return {"json": json.loads(value.decode("utf-8"))}
        except (UnicodeDecodeError, ValueError):
            return {_BYTES: base64.b64encode(value).decode("ascii")}
    if isinstance(value, Mapping):
        return {"dict": {str(k): _encode_leaf(v) for k, v in value.items()}}
    raise ConfigError(
        f"The grain iterator's state is not a dict or bytes. Received: state={type(value).__name__}."
    )


def _encode_leaf(value: Any) -> Any:
    if isinstance(value, bytes):
        return {_BYTES: base64.b64encode(value).decode("ascii")}
    if isinstance(value, Mapping):
        return {str(k): _encode_leaf(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode_leaf(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _decode(state: Mapping[str, Any]) -> Any:
    if "json" in state:
        return json.dumps(state["json"], indent=4).encode("utf-8")
    if _BYTES in state:
        return base64.b64decode(state[_BYTES])
    return _decode_leaf(state["dict"])


def _decode_leaf(value: Any) -> Any:
    if isinstance(value, Mapping):
        if set(value) == {_BYTES}:
            return base64.b64decode(value[_BYTES])
        return {k: _decode_leaf(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode_leaf(v) for v in value]
    return value


class GrainBatches:
    """Endless numpy batch dicts from a grain loader, with a JSON-able `get_state()`.

    Args:
        data: a grain `MapDataset`, `IterDataset` or `DataLoader` of batch dicts.
        state: a `get_state()` of an earlier iterator over the same loader (a resume).
    """

    def __init__(self, data: Any, state: Mapping[str, Any] | None = None):
        self.data = data
        self._make: Callable[[], Iterator[Any]]
        if isinstance(data, grain.MapDataset):
            infinite = len(data) >= sys.maxsize  # already repeated by the user
            repeated = (data if infinite else data.repeat()).to_iter_dataset()
            self._make = lambda: iter(repeated)
        else:
            self._make = lambda: iter(data)
        self.epoch = 0
        self._in_epoch = 0
        self._it: Any = self._make()
        if state:
            self.set_state(state)

    def __iter__(self) -> GrainBatches:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        try:
            element = next(self._it)
        except StopIteration:
            if self._in_epoch == 0:
                raise ConfigError(
                    f"The grain loader yielded no batches. Received: data={type(self.data).__name__} "
                    f"(epoch {self.epoch}). Check its source and batch size."
                ) from None
            self.epoch += 1  # a finite loader: the next epoch starts it again
            self._in_epoch = 0
            self._it = self._make()
            return next(self)
        self._in_epoch += 1
        return _as_batch(element, "data")

    def get_state(self) -> dict[str, Any]:
        """`{"epoch", "in_epoch", "position"}` (grain's iterator state, JSON-encoded)."""
        return {
            "epoch": self.epoch,
            "in_epoch": self._in_epoch,
            "position": _encode(self._it.get_state()),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Continue from a `get_state()`."""
        self.epoch = int(state.get("epoch", 0))
        self._in_epoch = int(state.get("in_epoch", 0))
        self._it = self._make()
        self._it.set_state(_decode(state["position"]))


def native_batches(data: Any, state: Mapping[str, Any] | None) -> GrainBatches:
    """The endless training batches of a grain loader, positioned by `state` (a resume)."""
    return GrainBatches(data, state)


def native_eval_batches(data: Any) -> Iterator[dict[str, np.ndarray]]:
    """One pass over a grain validation loader (it must be finite), in order."""
    if isinstance(data, grain.MapDataset):
        for i in range(len(data)):
            element = data[i]
            if element is not None:  # a filtered-out element
                yield _as_batch(element, "validation")
        return
    for element in data:
        yield _as_batch(element, "validation")
