"""The preemption signals and the wall-clock budget a plan names, validated.

A cluster ends a job with a signal (SIGTERM on Kubernetes and spot VMs, SIGUSR1 first on
SLURM with `--signal`) and a grace period before SIGKILL. A plan lists the signals that
preempt it (`resolve_signals`) and may carry a time budget (`resolve_max_time`); the run
(`pipekit_train.core.run._preemption`) installs the handlers and acts on them.
"""

from __future__ import annotations

import datetime
import re
import signal
from collections.abc import Iterable
from typing import Any

from pipekit_train.core._errors import ConfigError

__all__ = ["DEFAULT_PREEMPTION_SIGNALS", "resolve_max_time", "resolve_signals"]

DEFAULT_PREEMPTION_SIGNALS: tuple[str, ...] = ("SIGTERM", "SIGUSR1")
"""What `TrainingLoop(preemption_signals=...)` listens to by default."""

_DHMS = re.compile(r"^(\d+):(\d{1,2}):(\d{1,2}):(\d{1,2})$")


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
