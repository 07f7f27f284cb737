"""`LearningRateScale`: the run's one learning-rate scale and the backend's hook for it.

What the scale means, and how each backend reads it, is in `spec._lr_scale`.
"""

from __future__ import annotations

from collections.abc import Callable

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.spec._lr_scale import check_lr_scale

__all__ = ["LearningRateScale"]


class LearningRateScale:
    """The scale `s` (the backend trains at `schedule(step) * s`) and its backend hook.

    Args:
        enabled: whether a callback of the plan adjusts the rate (`adjusts_learning_rate`);
            only then was the backend's step built with a scale.
        backend: the backend name, for messages.

    Attributes:
        value: the current scale (1.0 until a callback changes it; restored on resume).
    """

    def __init__(self, enabled: bool, backend: str):
        self.enabled = bool(enabled)
        self.value = 1.0
        self._backend = backend
        self._hook: Callable[[float], None] | None = None

    def bind(self, hook: Callable[[float], None] | None) -> None:
        """The backend's `scale -> None` that applies a new scale to its step."""
        self._hook = hook

    def apply(self) -> None:
        """Hand the backend the current scale (at the start of training)."""
        if self.enabled and self._hook is not None:
            self._hook(self.value)

    def set(self, scale: float) -> None:
        """Set the scale: the next steps train at `schedule(step) * scale`.

        Raises:
            ConfigError: `scale` is not a finite number > 0, or no callback of the plan
                declares `adjusts_learning_rate` (the backend was built without the scale).
        """
        value = check_lr_scale(scale)
        if not self.enabled:
            raise ConfigError(
                "`set_lr_scale` needs a callback with `adjusts_learning_rate = True` in the "
                f"plan (the {self._backend!r} step was built without a learning-rate scale). "
                f"Received: scale={scale!r}. Set the attribute on the callback class."
            )
        self.value = value
        if self._hook is not None:
            self._hook(value)

    def restore(self, value: object) -> None:
        """The scale saved in a checkpoint's run state."""
        self.value = check_lr_scale(value)
