"""Preemption signals and wall-clock budgets: parsing, the flag handler, `Preempted`.

A cluster ends a job with a signal (SIGTERM on Kubernetes and spot VMs, SIGUSR1 first on
SLURM with `--signal`) and a grace period before SIGKILL. `SignalFlag` installs handlers
that only record the signal (no I/O runs inside a handler); the run lifecycle reads the
flag at each step boundary, checkpoints, restores the previous handlers and raises
`Preempted`.
"""

from __future__ import annotations

import datetime
import re
import signal
import threading
import warnings
from collections.abc import Iterable
from typing import Any

from ._errors import ConfigError, PipekitError

__all__ = [
    "DEFAULT_PREEMPTION_SIGNALS",
    "PREEMPTED_EXIT_STATUS",
    "Preempted",
    "SignalFlag",
    "resolve_max_time",
    "resolve_signals",
]

DEFAULT_PREEMPTION_SIGNALS: tuple[str, ...] = ("SIGTERM", "SIGUSR1")
"""What `TrainingLoop(preemption_signals=...)` listens to by default."""

PREEMPTED_EXIT_STATUS = 75
"""The CLI's exit status after `Preempted` (EX_TEMPFAIL: "try again later")."""

_DHMS = re.compile(r"^(\d+):(\d{1,2}):(\d{1,2}):(\d{1,2})$")


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


def _signal_name(value: Any) -> str:
    if isinstance(value, signal.Signals):
        return value.name
    if isinstance(value, str):
        name = value.strip().upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
        if isinstance(getattr(signal, name, None), signal.Signals):
            return name
    raise ConfigError(
        "`preemption_signals` must name signals. Received: "
        f"preemption_signals=[..., {value!r}, ...]. Use names such as 'SIGTERM' and "
        "'SIGUSR1' (or signal.Signals members)."
    )


def resolve_signals(value: Iterable[Any] | None) -> tuple[str, ...]:
    """Validate `preemption_signals`; return the signal names (`()` disables).

    Raises:
        ConfigError: not a list of signal names, or SIGINT/SIGKILL/SIGSTOP.
    """
    if value is None:
        return DEFAULT_PREEMPTION_SIGNALS
    if isinstance(value, (str, signal.Signals)):
        value = [value]
    try:
        items = list(value)
    except TypeError:
        raise ConfigError(
            "`preemption_signals` must be a list of signal names. Received: "
            f"preemption_signals={value!r}. Use e.g. ['SIGTERM', 'SIGUSR1'], or [] to disable."
        ) from None
    names: list[str] = []
    for item in items:
        name = _signal_name(item)
        if name in ("SIGINT", "SIGKILL", "SIGSTOP"):
            fix = (
                "SIGINT stays KeyboardInterrupt" if name == "SIGINT" else f"{name} cannot be caught"
            )
            raise ConfigError(
                f"`preemption_signals` cannot include {name}. Received: "
                f"preemption_signals={items!r}. Drop it ({fix})."
            )
        if name not in names:
            names.append(name)
    return tuple(names)


def resolve_max_time(value: Any) -> float | None:
    """Validate `max_time`: seconds, a `timedelta` or `"DD:HH:MM:SS"`; return seconds.

    Raises:
        ConfigError: not positive, or not one of those forms.
    """
    if value is None:
        return None
    seconds: float | None = None
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DHMS.match(value.strip())
        if match:
            d, h, m, s = (int(g) for g in match.groups())
            seconds = float(((d * 24 + h) * 60 + m) * 60 + s)
    if seconds is None or not seconds > 0 or seconds == float("inf"):
        raise ConfigError(
            "`max_time` must be a positive number of seconds, a datetime.timedelta or a "
            f'"DD:HH:MM:SS" string. Received: max_time={value!r}. Use e.g. max_time=3600 '
            'or max_time="00:12:00:00".'
        )
    return seconds


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
