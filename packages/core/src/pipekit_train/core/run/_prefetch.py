"""`Prefetcher`: the next batches reach the device while the current step runs.

A background thread pulls batches from the run's `Feed` and hands each group to the
backend's `put` (the host-to-device copy: a jax `device_put` with the run's sharding, a
pinned non-blocking torch copy) into a small queue; the training thread takes them in
order. The batches and their order are exactly those of the feed, and the data position a
checkpoint saves is still the one after the last batch *trained on* (the feed records the
position after every batch it hands out; the lifecycle counts the batches trained).

An error in the thread (a dataset that raises, a failed copy) is raised in the training
thread when it asks for the batch that failed, so it surfaces at the same step as without
prefetching.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["Prefetcher"]

_DONE = object()


class Prefetcher:
    """Groups of `size` batches from `feed`, made by `make(batches)` on a thread, `depth` ahead.

    Args:
        feed: the run's batch iterator (a tracking `Feed`: it is read ahead of training).
        make: `list of host batches -> device value` (stack and put).
        size: batches per group (the same for every group).
        depth: how many groups may wait in the queue.
    """

    def __init__(
        self,
        feed: Any,
        make: Callable[[Sequence[Mapping[str, Any]]], Any],
        *,
        size: int,
        depth: int = 2,
    ):
        self._feed = feed
        self._make = make
        self._size = int(size)
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(1, int(depth)))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pipekit-prefetch", daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                group = [next(self._feed) for _ in range(self._size)]
                if not self._put((True, self._make(group))):
                    return
        except BaseException as exc:  # handed to the training thread, raised there
            self._put((False, exc))

    def __next__(self) -> Any:
        ok, value = self._queue.get()
        if ok:
            return value
        self._stop.set()
        raise value

    def close(self) -> None:
        """Stop the thread (what it has read ahead is dropped; the feed knows the position)."""
        self._stop.set()
        while True:  # unblock a producer waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=10.0)
