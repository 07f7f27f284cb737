"""`NaNGuard`: stop with a clear error when the loss stops being finite."""

from __future__ import annotations

import math
import numbers
from typing import Any

from pipekit_train.core._errors import ConfigError, PipekitError

__all__ = ["NaNGuard", "NonFiniteLossError"]


class NonFiniteLossError(PipekitError, FloatingPointError):
    """A monitored training metric became NaN or infinite.

    Raised from `on_step_end`, so the step that produced the value is never
    checkpointed: the last good checkpoint stays the latest one on disk.

    Attributes:
        step: the step whose metric was non-finite.
        metric: the metric name.
        value: the offending value (`nan`, `inf` or `-inf`).
        consecutive: under `on_nonfinite="skip"`, how many consecutive steps were
            skipped when the run stopped (`max_consecutive_skips`); None otherwise.
    """

    def __init__(self, step: int, metric: str, value: float, consecutive: int | None = None):
        self.step = step
        self.metric = metric
        self.value = value
        self.consecutive = consecutive
        if consecutive is None:
            message = (
                f"Non-finite `{metric}` at step {step}: {metric}={value!r}. Training stopped; the "
                "last good checkpoint (written before this step) is kept and nothing from this "
                "step is saved. Lower the learning rate, clip gradients "
                "(optimizer_config['clip_norm']), or check the data for NaN/inf, then resume."
            )
        else:
            first = step - consecutive + 1
            message = (
                f"Non-finite `{metric}` at step {step}: {metric}={value!r}, the last of "
                f"{consecutive} consecutive skipped steps ({first}..{step}); on_nonfinite='skip' "
                f"stops after max_consecutive_skips={consecutive}. Training stopped; the updates of these "
                "steps were skipped and no checkpoint was written after the last finite step. "
                "Check the data for NaN/inf, lower the learning rate or clip gradients "
                "(optimizer_config['clip_norm']), then resume."
            )
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.step, self.metric, self.value, self.consecutive))


class NaNGuard:
    """Raise `NonFiniteLossError` as soon as `monitor` is NaN or infinite.

    Checks every `check_every_n_steps` steps (`state.step % n == 0`); reading
    `state.metrics` fetches the step's values to the host, so a larger `n` lets the
    runtime keep more steps on the device. A non-finite value found at a checked step
    may have appeared in an unchecked step before it.

    Args:
        monitor: the training metric to check.
        check_every_n_steps: check on every n-th step (>= 1).

    Raises:
        ConfigError: a bad argument, or a `monitor` missing from the step's metrics (the
            message lists the available keys).
        NonFiniteLossError: the monitored value is not finite.
    """

    produces: tuple[str, ...] = ()
    """The metric names it adds to the run (none; see `Callback.produces`)."""

    def __init__(self, monitor: str = "loss", check_every_n_steps: int = 1) -> None:
        if not isinstance(monitor, str) or not monitor:
            raise ConfigError(
                f"`monitor` must be a metric name. Received: monitor={monitor!r}. "
                "Pass e.g. monitor='loss'."
            )
        n = check_every_n_steps
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ConfigError(
                f"`check_every_n_steps` must be an integer >= 1. Received: check_every_n_steps={n!r}. "
                "Pass e.g. check_every_n_steps=1."
            )
        self.monitor: str = monitor
        self.check_every_n_steps: int = int(n)

    def on_step_end(self, state: Any) -> None:
        """Check the monitored metric on every `check_every_n_steps`-th step."""
        step = state.step
        if step % self.check_every_n_steps:
            return
        metrics = state.metrics
        if self.monitor not in metrics:
            raise ConfigError(
                "`monitor` names a metric that the training step did not produce. "
                f"Received: monitor={self.monitor!r}. Available keys: {sorted(metrics)}. "
                "Pass one of them to NaNGuard(monitor=...)."
            )
        value = float(metrics[self.monitor])
        if not math.isfinite(value):
            raise NonFiniteLossError(int(step), self.monitor, value)

    def __repr__(self) -> str:
        return f"NaNGuard(monitor={self.monitor!r}, check_every_n_steps={self.check_every_n_steps})"
