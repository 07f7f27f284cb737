"""`Feed`: the training batches of a run, and where the data stood after each one.

A framework's own loop often reads ahead of the step it runs (Lightning prefetches a
batch, Keras peeks at the first ones and transfers one ahead, a prefetching step driver
copies the next batch to the device while the current step runs), so the live position
of the batch iterator is ahead of training. A checkpoint must hold the position after
the last batch *trained on*. `Feed` wraps the run's batch iterator (core batching or a
native loader's) and answers `state_after(consumed)`: the iterator's state after the
first `consumed` batches it handed out in this run.

With `track=False` (a driver that never reads ahead) it records nothing: the state after
every batch handed out is the iterator's live state, read only when a checkpoint asks.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["Feed"]


class Feed(Iterator[Mapping[str, Any]]):
    """An endless iterator of batches that remembers the data position after each.

    Args:
        batches: the batch iterator, positioned where this run starts (a resume).
        track: record the position after every batch (needed when the consumer reads
            ahead of training); False reads the live position at a checkpoint.
        keep: how many recent positions to keep when tracking (at least the batches
            trained between two checkpoints' decisions plus the read-ahead).
    """

    def __init__(self, batches: Any, *, track: bool = True, keep: int = 256):
        self.batches = batches
        self.produced = 0
        self.track = bool(track)
        get_state = getattr(batches, "get_state", None)
        self._get_state = get_state if callable(get_state) else None
        self._states: deque[tuple[int, dict[str, Any] | None]] = deque(maxlen=max(2, keep))
        self._lock = threading.Lock()  # a prefetching thread appends while a save reads
        if self.track:
            self._states.append((0, self._state()))

    @property
    def checkpointable(self) -> bool:
        """Whether the iterator has a position to save (`get_state`)."""
        return self._get_state is not None

    def _state(self) -> dict[str, Any] | None:
        return None if self._get_state is None else self._get_state()

    def __iter__(self) -> Feed:
        return self

    def __next__(self) -> Mapping[str, Any]:
        batch = next(self.batches)
        if self.track:
            state = self._state()
            with self._lock:
                self.produced += 1
                self._states.append((self.produced, state))
        else:
            self.produced += 1
        return batch

    def state_after(self, consumed: int) -> dict[str, Any] | None:
        """The iterator's state after the first `consumed` batches of this run.

        Returns None for an iterator without `get_state` (a loader whose position cannot
        be saved).

        Raises:
            RuntimeError: that position is no longer known (the consumer read further
                ahead than `keep` batches); a bug to report, never a silent wrong state.
        """
        if not self.track:
            if consumed != self.produced:
                raise RuntimeError(
                    f"pipekit-train lost the data position: {consumed} batches were trained "
                    f"on but {self.produced} were read, and the feed was not tracking. "
                    "Please report this."
                )
            return self._state()
        with self._lock:
            states = list(self._states)
        for n, state in reversed(states):
            if n == consumed:
                return state
        raise RuntimeError(
            f"pipekit-train lost track of the data position after {consumed} batches (the "
            f"training loop read more than {self._states.maxlen} batches ahead). Please "
            "report this."
        )

    def __getattr__(self, name: str) -> Any:
        # the wrapped iterator's own attributes (epoch, steps_per_epoch, ...)
        if name == "batches":
            raise AttributeError(name)
        return getattr(self.batches, name)
