"""`LearningRateLogger`: send the learning rate to the metric writers."""

from __future__ import annotations

import numbers
from typing import Any

from pipekit_train.core._errors import ConfigError

__all__ = ["LearningRateLogger"]


class LearningRateLogger:
    """Log `{"lr": state.learning_rate}` with `state.log` every `every_n_steps` steps.

    Steps where the backend reports no learning rate (`None`) log nothing.

    Args:
        every_n_steps: log when `state.step % every_n_steps == 0`.
        name: the metric name.
    """

    def __init__(self, every_n_steps: int = 1, *, name: str = "lr") -> None:
        if (
            isinstance(every_n_steps, bool)
            or not isinstance(every_n_steps, numbers.Integral)
            or every_n_steps < 1
        ):
            raise ConfigError(
                f"`every_n_steps` must be an integer >= 1. Received: every_n_steps={every_n_steps!r}. "
                "Pass e.g. every_n_steps=1."
            )
        if not isinstance(name, str) or not name:
            raise ConfigError(f"`name` must be a non-empty string. Received: name={name!r}.")
        self.every_n_steps: int = int(every_n_steps)
        self.name: str = name
        #: the metric names it adds to the run (see `Callback.produces`)
        self.produces: tuple[str, ...] = (name,)

    def on_step_end(self, state: Any) -> None:
        """Log the learning rate on every `every_n_steps`-th step."""
        if state.step % self.every_n_steps:
            return
        lr = state.learning_rate
        if lr is not None:
            state.log({self.name: float(lr)})

    def __repr__(self) -> str:
        return f"LearningRateLogger(every_n_steps={self.every_n_steps})"
