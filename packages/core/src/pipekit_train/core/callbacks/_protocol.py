"""The `Callback` protocol and the handle on the run its hooks receive (`RunStateView`).

Callbacks are duck-typed: the runtime dispatches with `getattr(cb, hook, None)`, so a
callback implements any subset of the hooks. `Callback` is therefore a plain (not
`runtime_checkable`) `typing.Protocol`: it documents the full hook surface for static
typing only (ADR D9).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

__all__ = ["Callback", "RunStateView"]


class RunStateView(Protocol):
    """What a hook may read, and the three requests it may make (`set_lr_scale`, `log`,
    `request_stop`); the runtime's `RunState` provides it.

    `metrics` may force a device→host fetch: read it only when needed.
    """

    @property
    def step(self) -> int:
        """Optimizer steps completed."""
        ...

    @property
    def epoch(self) -> int:
        """The current epoch (0-based)."""
        ...

    @property
    def max_steps(self) -> int | None:
        """Total steps of the run, when known."""
        ...

    @property
    def metrics(self) -> dict[str, float]:
        """The latest step's metrics (plus `val_*` ones in `on_validation_end`), host floats."""
        ...

    @property
    def learning_rate(self) -> float | None:
        """The current learning rate, computed on access, when the backend reports one."""
        ...

    @property
    def lr_scale(self) -> float:
        """The learning-rate scale: the backend trains at `schedule(step) * lr_scale`."""
        ...

    @property
    def stop_requested(self) -> bool:
        """Whether a callback asked to stop."""
        ...

    def set_lr_scale(self, scale: float) -> None:
        """Scale the learning rate from the next step on (callbacks that declare
        `adjusts_learning_rate = True` only)."""
        ...

    @property
    def is_tty(self) -> bool:
        """Whether the process writes to a terminal."""
        ...

    @property
    def normalizer(self) -> Any:
        """The run's `Normalizer`, or None."""
        ...

    def predict(self, batch: Mapping[str, Any]) -> Any:
        """The model's predictions for a numpy batch (in the model's units) with the
        current weights, through validation's evaluator."""
        ...

    def log(self, metrics: Mapping[str, float]) -> None:
        """Send extra metrics to the writers at the current step."""
        ...

    def request_stop(self, reason: str) -> None:
        """Ask the run to stop after the current step."""
        ...


class Callback(Protocol):
    """The hooks a callback may implement (any subset; dispatch is by `getattr`).

    A callback that must resume exactly may also implement `state_dict() -> dict` (JSON)
    and `load_state_dict(d)`; the runtime stores them with each checkpoint.

    A callback may also declare `produces`: a tuple of the metric names it adds to the
    run (with `validation_metrics`, as recorded: with their `val_` prefix; through
    `state.log`), where a name may be an `fnmatch` pattern (`"val_rollout_*"`). The
    monitored names (`EarlyStopping`, `ReduceLROnPlateau`, `Checkpoint(monitor=...)`)
    are then checked when the `TrainingLoop` is built: a `val_` name must be
    `val_loss`, `val_<metric>` of `metrics=`, or one a callback declares. A callback
    that implements `validation_metrics` or `on_validation_end` and declares nothing
    may produce any name, so such a run's `val_` monitors are checked at the first
    validation instead. Core's callbacks all declare theirs.
    """

    def on_train_start(self, state: RunStateView) -> None:
        """Called once before the first step (also after a resume)."""
        ...

    def on_step_end(self, state: RunStateView) -> None:
        """Called after every optimizer step."""
        ...

    def validation_metrics(self, state: RunStateView) -> Mapping[str, float]:
        """Called at each validation, before `on_validation_end`: extra metrics measured
        with the current weights (`state.predict`), e.g. a rollout's errors. They join
        the validation's metrics (names get `val_`), so `Checkpoint(monitor=...)`,
        `EarlyStopping` and `ReduceLROnPlateau` may watch them."""
        ...

    def on_validation_end(self, state: RunStateView) -> None:
        """Called after a validation pass; `state.metrics` holds the `val_*` metrics."""
        ...

    def on_checkpoint(self, state: RunStateView, path: str) -> None:
        """Called after a checkpoint was written at `path`."""
        ...

    def on_train_end(self, state: RunStateView, artifact: Any) -> None:
        """Called once after training, with the training artifact."""
        ...
