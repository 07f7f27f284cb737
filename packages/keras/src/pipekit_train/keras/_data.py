"""Feed core's batch iterator to `model.fit` and know its state at every step.

`model.fit` pulls batches from a Python generator over core's `BatchIterator` (the same
order as every other backend for the same seed). Keras reads ahead of the step it runs
(it peeks at the first batches to build its data adapter; on accelerators it transfers
one batch ahead), so the iterator's live state is ahead of training. `FitFeed` records
the iterator state after every batch it hands out and answers "what was the state after
the first `n` batches", which is what a checkpoint at step `start + n` must hold.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

__all__ = ["FitFeed"]

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
        self._states: deque[tuple[int, dict[str, Any]]] = deque(maxlen=capacity + _MAX_AHEAD)
        self._states.append((0, batches.get_state()))

    def generator(self) -> Iterator[tuple[Any, Any]]:
        """Yield `(x, y)` forever (core iterators repeat epochs)."""
        batches, states = self.batches, self._states
        while True:
            batch = next(batches)
            self.produced += 1
            states.append((self.produced, batches.get_state()))
            yield batch["x"], batch["y"]

    def state_after(self, consumed: int) -> dict[str, Any]:
        """The iterator state after the first `consumed` batches of this feed."""
        for n, state in reversed(self._states):
            if n == consumed:
                return state
        raise RuntimeError(
            f"pipekit-train-keras lost track of the data iterator state after {consumed} "
            f"batches (Keras read more than {_MAX_AHEAD} batches ahead). Please report this."
        )
