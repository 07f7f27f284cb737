"""`AsyncWriter`: move the device→host transfer and the I/O of a writer to a thread."""

from __future__ import annotations

import numbers
import queue
import threading
from collections.abc import Mapping
from typing import Any

from pipekit_train.core._errors import ConfigError

from ._protocol import check_writer

__all__ = ["AsyncWriter"]

_WRITE, _FLUSH, _CLOSE = "write", "flush", "close"


class AsyncWriter:
    """Run another writer in a background thread so the step loop never waits on logging.

    `write` only puts the record on a bounded queue; a worker thread converts the values
    with `float()` (so the device→host transfer of device scalars happens off the
    training thread) and calls the inner writer, in order. When the queue is full,
    `write` blocks until there is room (back-pressure: a writer slower than training
    slows training down instead of growing memory without bound).

    `flush()` waits until every record queued before it is written and the inner writer
    flushed; `close()` drains the queue, closes the inner writer and stops the thread.
    An exception raised by the inner writer in the thread is re-raised in the caller by
    the next `write`, `flush` or `close` (once); records queued after it are still
    written. Values must not be mutated after `write` (pass fresh or detached arrays).
    The thread is a daemon: call `close()` (the runtime does) or records still queued
    at interpreter exit are lost.

    Args:
        writer: the writer to run in the thread.
        max_queue: the most records waiting in the queue.

    Raises:
        ConfigError: `writer` is not a writer or `max_queue` is not a positive integer.
    """

    def __init__(self, writer: Any, max_queue: int = 1000) -> None:
        check_writer(writer, field="writer")
        if (
            isinstance(max_queue, bool)
            or not isinstance(max_queue, numbers.Integral)
            or max_queue < 1
        ):
            raise ConfigError(
                f"`max_queue` must be an integer >= 1. Received: max_queue={max_queue!r}. "
                "Pass e.g. max_queue=1000."
            )
        self.writer: Any = writer
        self.max_queue: int = int(max_queue)
        self._queue: queue.Queue[tuple[Any, ...]] = queue.Queue(maxsize=self.max_queue)
        self._error: BaseException | None = None
        self._error_lock: threading.Lock = threading.Lock()
        self._closed: bool = False
        self._thread: threading.Thread = threading.Thread(
            target=self._run, name=f"AsyncWriter({type(writer).__name__})", daemon=True
        )
        self._thread.start()

    # ------------------------------------------------------------------ worker thread
    def _record_error(self, exc: BaseException) -> None:
        with self._error_lock:
            if self._error is None:
                self._error = exc

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            kind = item[0]
            try:
                if kind == _WRITE:
                    _, step, metrics = item
                    self.writer.write(step, {k: float(v) for k, v in metrics.items()})
                elif kind == _FLUSH:
                    self.writer.flush()
                else:
                    self.writer.close()
            except BaseException as exc:  # surfaced in the caller
                self._record_error(exc)
            finally:
                if kind != _WRITE:
                    item[1].set()
                self._queue.task_done()
            if kind == _CLOSE:
                return

    # ------------------------------------------------------------------ caller side
    def _raise_pending(self) -> None:
        with self._error_lock:
            exc, self._error = self._error, None
        if exc is not None:
            raise exc

    def _wait_for(self, kind: str) -> None:
        done = threading.Event()
        self._queue.put((kind, done))
        done.wait()

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Queue a record (blocks while the queue is full).

        Raises:
            RuntimeError: the writer is closed.
            Exception: the inner writer failed since the last call.
        """
        if self._closed:
            raise RuntimeError(f"AsyncWriter({self.writer!r}) is closed.")
        self._raise_pending()
        self._queue.put((_WRITE, int(step), dict(metrics)))

    def flush(self) -> None:
        """Wait until every queued record is written and the inner writer flushed."""
        if not self._closed:
            self._wait_for(_FLUSH)
        self._raise_pending()

    def close(self) -> None:
        """Drain the queue, close the inner writer and stop the thread (idempotent)."""
        if not self._closed:
            self._closed = True
            self._wait_for(_CLOSE)
            self._thread.join()
        self._raise_pending()

    def state_dict(self) -> dict[str, Any]:
        """The inner writer's state after a flush (`{}` when it has none)."""
        self.flush()
        inner = getattr(self.writer, "state_dict", None)
        return inner() if callable(inner) else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Pass the state to the inner writer (after draining the queue)."""
        inner = getattr(self.writer, "load_state_dict", None)
        if callable(inner) and state:
            self.flush()
            inner(state)

    def __repr__(self) -> str:
        return f"AsyncWriter({self.writer!r}, max_queue={self.max_queue})"
