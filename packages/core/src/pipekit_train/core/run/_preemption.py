"""Preemption in a run: the flag handler and `Preempted` (the plan's signals: `spec._signals`).

A cluster ends a job with a signal (SIGTERM on Kubernetes and spot VMs, SIGUSR1 first on
SLURM with `--signal`) and a grace period before SIGKILL. `SignalFlag` installs handlers
that only record the signal (no I/O runs inside a handler); the run lifecycle reads the
flag at each step boundary, checkpoints, restores the previous handlers and raises
`Preempted`.
"""

from __future__ import annotations

import signal
import threading
import warnings
from collections.abc import Iterable
from typing import Any

from pipekit_train.core._errors import PipekitError

__all__ = ["PREEMPTED_EXIT_STATUS", "Preempted", "SignalFlag"]

PREEMPTED_EXIT_STATUS = 75
"""The CLI's exit status after `Preempted` (EX_TEMPFAIL: "try again later")."""


class Preempted(PipekitError):
    """The run stopped on a preemption signal after checkpointing its current step.

    Rerun the same command (same checkpoint directory) to continue from `checkpoint`.

    Attributes:
        step: the optimizer steps completed when the run stopped.
        checkpoint: where that step was saved (None when the plan has no `Checkpoint`).
        signal: the signal's name (`"SIGTERM"`), or None when it arrived on another
            process of a multi-process run.
    """

    def __init__(self, step: int, checkpoint: str | None, signal: str | None):
        self.step = int(step)
        self.checkpoint = checkpoint
        self.signal = signal
        what = signal or "a preemption signal on another process"
        where = (
            f"checkpoint saved at {checkpoint}; rerun to resume from it"
            if checkpoint is not None
            else "no Checkpoint is configured, so nothing was saved"
        )
        super().__init__(f"Preempted by {what} at step {self.step} ({where}).")

    def __reduce__(self) -> Any:  # keep it copyable across processes/threads
        return (type(self), (self.step, self.checkpoint, self.signal))


class SignalFlag:
    """Handlers for `names` that only record which signal arrived.

    `install()` works from the main thread only (Python's rule for `signal.signal`); from
    another thread it installs nothing and warns once: the embedding application then
    owns its signals (it can still stop the run with `max_time` or a callback's
    `request_stop`). `restore()` puts the previous handlers back (idempotent).
    """

    def __init__(self, names: Iterable[str]):
        self.names = tuple(names)
        self.received: str | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        # no I/O, no locks: remember the first signal; the step boundary does the rest
        if self.received is None:
            self.received = signal.Signals(signum).name

    def install(self) -> None:
        """Install the flag handlers (main thread only; elsewhere a warning)."""
        if not self.names or self._previous:
            return
        if threading.current_thread() is not threading.main_thread():
            warnings.warn(
                "The run is not on the main thread, so its preemption handlers "
                f"({', '.join(self.names)}) are not installed: a signal ends the process "
                "as its current handler says. Run the training on the main thread, or stop "
                "it with max_time / a callback's request_stop().",
                stacklevel=3,
            )
            return
        for name in self.names:
            sig = signal.Signals[name]
            self._previous[sig] = signal.signal(sig, self._handler)

    def restore(self) -> None:
        """Put back the handlers that were there before `install()`."""
        previous, self._previous = self._previous, {}
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
