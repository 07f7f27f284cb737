"""Device values to the host: the `fetch` a Keras run hands core's `RunLifecycle`.

The per-step losses (and grad norms) of a `model.fit` run stay on the device, in the
ring buffers of the `StepLossTracker` (`_tracker`) and the `GradNormBuffer`
(`_grad_norm`); the bridge hands the lifecycle `StepSlice`s of them as metric values,
and `fetch` brings every pending slice to the host in one transfer, checking
that Keras ran exactly the steps the bridge scheduled.

This module imports keras; import it only after the Keras backend is chosen.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import keras
from keras import ops

from ._tracker import COUNT_MODULUS

__all__ = ["StepSlice", "fetch"]


class StepSlice:
    """Steps `[first, first + count)` of the tracker's ring buffer, still on the device.

    Handed to the run as a metric value. `fetch` brings them to the host in
    one transfer and checks that Keras ran exactly the steps the adapter scheduled.
    """

    __slots__ = ("packed", "first", "count", "kind")

    def __init__(self, packed: Any, first: int, count: int, kind: str = "loss"):
        self.packed, self.first, self.count = packed, first, count
        self.kind = kind  # slices of one ring buffer share a kind (losses, grad norms)

    @property
    def end(self) -> int:
        """The step count after these steps (mod `COUNT_MODULUS`)."""
        return (self.first + self.count) % COUNT_MODULUS


def _select(piece: StepSlice, owner: StepSlice, host: Any) -> np.ndarray:
    """`piece`'s losses from the host copy of `owner.packed` (a later or the same snapshot)."""
    host = np.asarray(host, dtype=np.float32).reshape(-1)
    capacity = host.shape[0] - 1
    seen = int(host[-1])
    if seen != owner.end:
        raise RuntimeError(
            f"Keras ran {(seen - owner.first) % COUNT_MODULUS} steps in one execution where "
            f"{owner.count} were scheduled; this Keras version does not honour a changed "
            "`steps_per_execution`. Use Keras(steps_per_execution=1), or report this."
        )
    return host[[(piece.first + i) % capacity for i in range(piece.count)]]


def fetch(values: Sequence[Any]) -> list[np.ndarray]:
    """The run's fetch: device values and `StepSlice`s to numpy in one transfer.

    The ring buffer holds the last `capacity` steps, so the newest snapshot usually
    covers every pending `StepSlice` and only that one array crosses to the host.
    """
    slices = [v for v in values if isinstance(v, StepSlice)]
    newest_of: dict[str, StepSlice] = {v.kind: v for v in slices}  # the last of each kind
    owners: dict[int, StepSlice] = {}
    raw: list[Any] = []
    index: dict[int, int] = {}  # id(owner.packed) -> position in raw

    def need(owner: StepSlice) -> None:
        if id(owner.packed) not in index:
            index[id(owner.packed)] = len(raw)
            raw.append(owner.packed)

    for v in slices:
        newest = newest_of[v.kind]
        capacity = int(v.packed.shape[0]) - 1
        covered = (newest.end - v.first) % COUNT_MODULUS <= capacity
        owners[id(v)] = newest if covered else v
        need(owners[id(v)])
    plain = [v for v in values if not isinstance(v, StepSlice)]
    for v in plain:
        index[id(v)] = len(raw)
        raw.append(v)
    if keras.backend.backend() == "jax":
        import jax

        host = jax.device_get(raw)
    else:
        host = [ops.convert_to_numpy(v) for v in raw]
    out = []
    for v in values:
        if isinstance(v, StepSlice):
            owner = owners[id(v)]
            out.append(_select(v, owner, host[index[id(owner.packed)]]))
        else:
            out.append(np.asarray(host[index[id(v)]]))
    return out
