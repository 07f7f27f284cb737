"""`RunState`, the read-only view of a run that callbacks receive."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._runtime import RunContext

__all__ = ["RunState"]


class RunState:
    """The read-only view of a run that callbacks receive."""

    def __init__(self, ctx: RunContext):
        self._ctx = ctx

    @property
    def step(self) -> int:
        """Optimizer steps completed."""
        return self._ctx.step

    @property
    def epoch(self) -> int:
        """The current epoch (0-based)."""
        return self._ctx.epoch

    @property
    def max_steps(self) -> int | None:
        """Total steps of the run, when known."""
        return self._ctx.total_steps

    @property
    def metrics(self) -> dict[str, float]:
        """The latest metrics as host floats (fetches pending device values)."""
        return self._ctx._latest_metrics()

    @property
    def learning_rate(self) -> float | None:
        """The current learning rate, if the backend reports one."""
        return self._ctx._learning_rate()

    @property
    def lr_scale(self) -> float:
        """The learning-rate scale: the backend trains at `schedule(step) * lr_scale`."""
        return self._ctx._lr_scale

    def set_lr_scale(self, scale: float) -> None:
        """Set the learning-rate scale from the next step on (it must be finite and > 0)."""
        self._ctx._set_lr_scale(scale)

    @property
    def stop_requested(self) -> bool:
        """Whether a callback asked to stop."""
        return self._ctx._stop_reason is not None

    @property
    def stop_reason(self) -> str | None:
        """Why a callback asked to stop."""
        return self._ctx._stop_reason

    @property
    def is_tty(self) -> bool:
        """Whether stderr is a terminal (progress bars default to on there)."""
        return bool(getattr(sys.stderr, "isatty", lambda: False)())

    @property
    def backend(self) -> str:
        """The backend name."""
        return self._ctx._backend

    @property
    def plan(self) -> dict[str, Any]:
        """The JSON plan."""
        return self._ctx._plan_json

    def log(self, metrics: Mapping[str, float]) -> None:
        """Send extra metrics to the writers at the current step."""
        self._ctx._log(metrics)

    def request_stop(self, reason: str) -> None:
        """Stop training after the current step."""
        self._ctx._request_stop(reason)
