"""`Callbacks`: the run's callbacks and the dispatch of their hooks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["HOOKS", "Callbacks"]

HOOKS = (
    "on_train_start",
    "on_step_end",
    "validation_metrics",
    "on_validation_end",
    "on_checkpoint",
    "on_train_end",
)
"""The hooks a callback may implement (any subset)."""


class Callbacks:
    """Dispatches hooks to callbacks (found by `getattr`: a callback implements any subset).

    Args:
        callbacks: the plan's callbacks (and any the run adds, e.g. a progress bar).
        state: the `RunState` every hook receives first (reads and three requests).
    """

    def __init__(self, callbacks: Sequence[Any], state: Any):
        self.callbacks = list(callbacks)
        self.state = state
        self._step_hooks = [
            hook for cb in self.callbacks if callable(hook := getattr(cb, "on_step_end", None))
        ]

    @property
    def has_step_hooks(self) -> bool:
        """Whether a callback implements `on_step_end`."""
        return bool(self._step_hooks)

    def validation_metrics(self) -> dict[str, float]:
        """The extra metrics of every callback that measures the model at validation
        (`validation_metrics(state) -> {name: value}`), merged in callback order."""
        out: dict[str, float] = {}
        for cb in self.callbacks:
            fn = getattr(cb, "validation_metrics", None)
            if callable(fn):
                out.update({str(k): float(v) for k, v in (fn(self.state) or {}).items()})
        return out

    def dispatch(self, hook: str, *args: Any) -> None:
        """Call `hook(state, *args)` on every callback that implements it."""
        for cb in self.callbacks:
            fn = getattr(cb, hook, None)
            if callable(fn):
                fn(self.state, *args)

    def step_end(self) -> None:
        """`on_step_end` on every callback that implements it (the hot path)."""
        for hook in self._step_hooks:
            hook(self.state)
