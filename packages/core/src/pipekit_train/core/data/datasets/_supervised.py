"""`as_supervised`: say which key of a dataset is the input and which the target."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError

from ._dataset import ArraySpec, Batch, IterableDataset, Sample, gather_batch, spec_of
from ._hashing import Hasher

__all__ = ["Supervised", "as_supervised"]


def _dataset_keys(dataset: Any) -> tuple[str, ...]:
    keys = getattr(dataset, "keys", None)
    if isinstance(keys, tuple):
        return keys
    spec = getattr(dataset, "element_spec", None)
    if spec is not None:
        return tuple(spec)
    return tuple(dataset[0])


class Supervised:
    """A view of `dataset` whose samples are `{"x": sample[input], "y": sample[target]}`.

    Made by `as_supervised`. Other keys are left out. `get_batch` delegates to the
    parent's (so a cached or in-memory dataset keeps its fast gather); the fingerprint
    is the parent's plus the two key names.

    Args:
        dataset: an indexable dataset (`len()` and `[i]`).
        input: the key the model reads (it becomes `"x"`).
        target: the key the loss compares against (it becomes `"y"`).
    """

    def __init__(self, dataset: Any, input: str, target: str) -> None:
        self.dataset = dataset
        self.input = input
        self.target = target

    def _map(self, sample: Any) -> dict[str, Any]:
        return {"x": sample[self.input], "y": sample[self.target]}

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Sample:
        return self._map(self.dataset[index])

    def get_batch(self, indices: np.ndarray) -> Batch:
        """The parent's batch at `indices`, with the two keys renamed."""
        return self._map(gather_batch(self.dataset, np.asarray(indices)))

    @property
    def gather_block_rows(self) -> int | None:
        """The parent's `gather_block_rows` (None if it has none)."""
        return getattr(self.dataset, "gather_block_rows", None)

    @property
    def element_spec(self) -> dict[str, ArraySpec]:
        """`{"x": spec of input, "y": spec of target}`."""
        spec = getattr(self.dataset, "element_spec", None)
        if spec is None:
            return spec_of(self[0])
        return {"x": spec[self.input], "y": spec[self.target]}

    @property
    def keys(self) -> tuple[str, ...]:
        """`("x", "y")`."""
        return ("x", "y")

    def fingerprint(self) -> str:
        """SHA-256 of the parent's fingerprint and the key mapping."""
        parent = getattr(self.dataset, "fingerprint", None)
        h = Hasher("Supervised")
        h.update_json(parent() if callable(parent) else type(self.dataset).__name__)
        h.update_json({"input": self.input, "target": self.target})
        return h.hexdigest()

    def __repr__(self) -> str:
        return f"as_supervised({self.dataset!r}, input={self.input!r}, target={self.target!r})"


def as_supervised(dataset: Any, input: str, target: str) -> Supervised:
    """A view of `dataset` with the model input under `"x"` and the target under `"y"`.

    `TrainingLoop` trains on samples `{"x": input, "y": target}`. A dataset whose keys
    name other things (a `SimulationDataset` yields `{"theta": params, "x": output}`)
    says which key plays which part with this one line. The same simulations serve
    either direction:

    - an emulator (parameters → outputs): `as_supervised(sims, input="theta", target="x")`;
    - amortized inference (observations → parameters):
      `as_supervised(sims, input="x", target="theta")`.

    The view works before or after `split`, on a `CachedDataset` built from the raw
    simulations and on any indexable dataset; keys other than the two are left out.

    Args:
        dataset: an indexable dataset (`len()` and `[i]`).
        input: the key the model reads.
        target: the key the loss compares against.

    Returns:
        A `Supervised` view.

    Raises:
        ConfigError: `dataset` is a stream, or a key is not in the dataset, or
            `input == target`.

    Examples:
        >>> import numpy as np
        >>> from pipekit_train.core.data import SimulationDataset, as_supervised
        >>> sims = SimulationDataset(np.sin, lambda rng: rng.uniform(-1, 1, 3), n=100)
        >>> sims.keys
        ('theta', 'x')
        >>> emulator_data = as_supervised(sims, input="theta", target="x")
        >>> emulator_data.keys, len(emulator_data)
        (('x', 'y'), 100)
    """
    if isinstance(dataset, IterableDataset):
        raise ConfigError(
            "`as_supervised` needs an indexable dataset. Received: an IterableDataset. "
            "Yield samples {'x': input, 'y': target} from the stream's source instead."
        )
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise ConfigError(
            "`dataset` must be indexable (`len()` and `[i]`). "
            f"Received: dataset={type(dataset).__name__}."
        )
    for field, key in (("input", input), ("target", target)):
        if not isinstance(key, str) or not key:
            raise ConfigError(
                f"`{field}` must be a sample key (a string). Received: {field}={key!r}."
            )
    if input == target:
        raise ConfigError(
            f"`input` and `target` must be different keys. Received: input={input!r}, "
            f"target={target!r}."
        )
    keys = _dataset_keys(dataset)
    for field, key in (("input", input), ("target", target)):
        if key not in keys:
            raise ConfigError(
                f"`{field}` must be one of the dataset's keys {list(keys)}. "
                f"Received: {field}={key!r}."
            )
    return Supervised(dataset, input, target)
