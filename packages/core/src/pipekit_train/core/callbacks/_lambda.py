"""`LambdaCallback`: a callback from plain functions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipekit_train.core._errors import ConfigError

__all__ = ["LambdaCallback"]

HOOKS = ("on_train_start", "on_step_end", "on_validation_end", "on_checkpoint", "on_train_end")


class LambdaCallback:
    """A callback whose hooks are the functions given as keywords.

    Only the hooks that are given exist as attributes, so the runtime skips the others
    entirely (`getattr(cb, hook, None)` is `None`).

    Args:
        on_train_start: `fn(state)`.
        on_step_end: `fn(state)`.
        on_validation_end: `fn(state)`.
        on_checkpoint: `fn(state, path)`.
        on_train_end: `fn(state, artifact)`.

    Examples:
        >>> from pipekit_train.core.callbacks import LambdaCallback
        >>> cb = LambdaCallback(on_step_end=lambda state: print(state.step))
    """

    def __init__(
        self,
        *,
        on_train_start: Callable[[Any], Any] | None = None,
        on_step_end: Callable[[Any], Any] | None = None,
        on_validation_end: Callable[[Any], Any] | None = None,
        on_checkpoint: Callable[[Any, str], Any] | None = None,
        on_train_end: Callable[[Any, Any], Any] | None = None,
    ):
        given = {
            "on_train_start": on_train_start,
            "on_step_end": on_step_end,
            "on_validation_end": on_validation_end,
            "on_checkpoint": on_checkpoint,
            "on_train_end": on_train_end,
        }
        for hook, fn in given.items():
            if fn is None:
                continue
            if not callable(fn):
                raise ConfigError(
                    f"`{hook}` must be a callable. Received: {hook}={fn!r}. "
                    "Pass a function or leave it out."
                )
            setattr(self, hook, fn)

    @property
    def hooks(self) -> tuple[str, ...]:
        """The names of the hooks this callback implements."""
        return tuple(h for h in HOOKS if h in self.__dict__)

    def __repr__(self) -> str:
        return f"LambdaCallback({', '.join(self.hooks)})"
