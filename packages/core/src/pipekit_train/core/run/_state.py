"""`RunState`: the callbacks' handle on a run.

A hook reads the run through it (progress, metrics, the learning rate, the plan, the
normalizer, predictions with the current weights) and may ask three things of it: a new
learning-rate scale (`set_lr_scale`), extra metrics for the writers (`log`) and a stop
after the current step (`request_stop`). Nothing else of the run can be changed from a
callback: the requests go through the run's own parts, which apply them at the step's end.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ._context import RunContext

__all__ = ["RunState"]


class RunState:
    """The callbacks' handle on a run: what they read, and three requests.

    Reads: `step`, `epoch`, `max_steps`, `metrics`, `learning_rate`, `lr_scale`,
    `stop_requested`, `stop_reason`, `is_tty`, `backend`, `plan`, `normalizer` and
    `predict(batch)`. Requests: `set_lr_scale(scale)`, `log(metrics)` and
    `request_stop(reason)`.
    """

    def __init__(self, ctx: RunContext):
        self._ctx = ctx

    @property
    def step(self) -> int:
        """Optimizer steps completed."""
        return self._ctx.progress.step

    @property
    def epoch(self) -> int:
        """The current epoch (0-based)."""
        return self._ctx.progress.epoch

    @property
    def max_steps(self) -> int | None:
        """Total steps of the run, when known."""
        return self._ctx.progress.total_steps

    @property
    def metrics(self) -> dict[str, float]:
        """The latest metrics as host floats (fetches pending device values)."""
        return self._ctx.metrics.latest_metrics()

    @property
    def learning_rate(self) -> float | None:
        """The current learning rate, if the backend reports one."""
        return self._ctx.learning_rate()

    @property
    def lr_scale(self) -> float:
        """The learning-rate scale: the backend trains at `schedule(step) * lr_scale`."""
        return self._ctx.lr_scale.value

    def set_lr_scale(self, scale: float) -> None:
        """Set the learning-rate scale from the next step on (it must be finite and > 0)."""
        self._ctx.lr_scale.set(scale)

    @property
    def stop_requested(self) -> bool:
        """Whether a callback asked to stop."""
        return self._ctx.progress.stop_reason is not None

    @property
    def stop_reason(self) -> str | None:
        """Why a callback asked to stop."""
        return self._ctx.progress.stop_reason

    @property
    def is_tty(self) -> bool:
        """Whether stderr is a terminal (progress bars default to on there)."""
        return bool(getattr(sys.stderr, "isatty", lambda: False)())

    @property
    def backend(self) -> str:
        """The backend name."""
        return self._ctx.backend

    @property
    def plan(self) -> dict[str, Any]:
        """The run's `Plan` in its JSON form (`Plan.to_json()`, what checkpoints and the
        artifact record)."""
        return self._ctx.plan_json

    @property
    def normalizer(self) -> Any:
        """The run's `Normalizer` (None when the run trains on raw units)."""
        return self._ctx.plan.normalizer

    def predict(self, batch: Mapping[str, Any]) -> np.ndarray:
        """The model's predictions for a numpy batch with the current weights.

        The batch (`x` and `y`, already in the model's units: normalise with
        `normalizer` first) goes through the evaluator validation uses, inside its scope
        (evaluation mode, the moving average swapped in). Call it from `on_step_end` or
        `on_validation_end` on a single-process run.

        Raises:
            NotSupportedError: the driver has no evaluator (`OnlineTrainer`).
        """
        if self._ctx.predict is None:
            from pipekit_train.core.contract._adapter import NotSupportedError

            raise NotSupportedError(
                "This run cannot predict from a callback: its driver bound no evaluator. "
                f"Received: backend={self._ctx.backend!r}. Use TrainingLoop (every backend "
                "binds one), or evaluate the model after the run."
            )
        return np.asarray(self._ctx.predict(batch))

    def log(self, metrics: Mapping[str, float]) -> None:
        """Send extra metrics to the writers at the current step."""
        self._ctx.metrics.log(metrics)

    def request_stop(self, reason: str) -> None:
        """Stop training after the current step."""
        self._ctx.progress.request_stop(reason)
