"""`EarlyStopping`: stop when a validation metric stops improving."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

from pipekit_train.core._errors import ConfigError

from ._monitor import improved, monitored_value

__all__ = ["EarlyStopping"]


class EarlyStopping:
    """Ask the run to stop when `monitor` has not improved for `patience` validations.

    Acts in `on_validation_end` only. A value improves when it beats the best so far by
    more than `min_delta` (`value < best - min_delta` in `"min"` mode,
    `value > best + min_delta` in `"max"` mode); non-finite values never improve. After
    `patience` validations in a row without improvement it calls
    `state.request_stop(reason)` (so `patience=0` stops at the first one).
    Its progress (`best`, `wait`, ...) is in `state_dict()`, so a resumed run stops
    exactly where an uninterrupted one would.

    With `restore_best=True` the run's artifact holds the weights of its best checkpoint,
    as Keras's `restore_best_weights` does: it is `TrainingLoop(restore_best=True)`
    spelled here (see there), so the run needs `checkpoint=Checkpoint(..., keep_best=1)`
    ranking by this callback's `monitor` and `mode`. The best step is the checkpoint's
    (the best value, whatever `min_delta`), the one `artifact.best_step` names.

    Args:
        monitor: the metric to watch, as named in `state.metrics` (validation metrics
            carry a `val_` prefix).
        patience: validations without improvement tolerated before stopping.
        mode: `"min"` (lower is better) or `"max"`.
        min_delta: the smallest change that counts as an improvement (>= 0).
        restore_best: end the run with the best checkpoint's weights (by `monitor`).

    Raises:
        ConfigError: a bad argument here; at `TrainingLoop` construction a `monitor` no
            part of the run produces, or `restore_best=True` without a checkpoint that
            keeps the best by the same `monitor` and `mode`; at validation time a
            `monitor` that the validation did not produce (the message lists the
            available keys).
    """

    produces: tuple[str, ...] = ()
    """The metric names it adds to the run (none; see `Callback.produces`)."""

    def __init__(
        self,
        monitor: str = "val_loss",
        patience: int = 5,
        mode: str = "min",
        min_delta: float = 0.0,
        restore_best: bool = False,
    ) -> None:
        if not isinstance(monitor, str) or not monitor:
            raise ConfigError(
                f"`monitor` must be a metric name. Received: monitor={monitor!r}. "
                "Pass e.g. monitor='val_loss'."
            )
        if isinstance(patience, bool) or not isinstance(patience, numbers.Integral) or patience < 0:
            raise ConfigError(
                f"`patience` must be an integer >= 0. Received: patience={patience!r}. "
                "Pass e.g. patience=5."
            )
        if mode not in ("min", "max"):
            raise ConfigError(
                f"`mode` must be 'min' or 'max'. Received: mode={mode!r}. "
                "Use 'min' for losses and errors, 'max' for scores such as accuracy."
            )
        if (
            isinstance(min_delta, bool)
            or not isinstance(min_delta, numbers.Real)
            or not math.isfinite(min_delta)
            or min_delta < 0
        ):
            raise ConfigError(
                f"`min_delta` must be a finite number >= 0. Received: min_delta={min_delta!r}. "
                "Pass e.g. min_delta=0.0."
            )
        if not isinstance(restore_best, bool):
            raise ConfigError(
                f"`restore_best` must be True or False. Received: restore_best={restore_best!r}."
            )
        self.monitor: str = monitor
        self.restore_best: bool = restore_best
        self.patience: int = int(patience)
        self.mode: str = mode
        self.min_delta: float = float(min_delta)
        self.best: float | None = None
        self.best_step: int | None = None
        self.wait: int = 0
        self.stopped_step: int | None = None

    def _improved(self, value: float) -> bool:
        return improved(value, self.best, mode=self.mode, min_delta=self.min_delta)

    def on_validation_end(self, state: Any) -> None:
        """Update the best value and the wait counter; request a stop when patience runs out."""
        metrics = state.metrics
        value = monitored_value(metrics, self.monitor, "EarlyStopping")
        if self._improved(value):
            self.best, self.best_step, self.wait = value, int(state.step), 0
            return
        self.wait += 1
        if self.wait >= self.patience:
            self.stopped_step = int(state.step)
            best = "none yet" if self.best is None else f"{self.best:.6g} at step {self.best_step}"
            state.request_stop(
                f"EarlyStopping: `{self.monitor}` did not improve by more than "
                f"min_delta={self.min_delta:g} for {self.wait} validation(s) "
                f"(patience={self.patience}; best {best}; last {value:.6g})."
            )

    def state_dict(self) -> dict[str, Any]:
        """JSON state: `best`, `best_step`, `wait`, `stopped_step` (+ the settings, checked on load)."""
        return {
            "monitor": self.monitor,
            "mode": self.mode,
            "best": self.best,
            "best_step": self.best_step,
            "wait": self.wait,
            "stopped_step": self.stopped_step,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the state saved by `state_dict()`.

        Raises:
            ConfigError: the state was saved by an EarlyStopping watching another metric or
                mode, or lacks a key.
        """
        missing = [k for k in ("best", "best_step", "wait") if k not in state]
        if missing:
            raise ConfigError(
                f"`state` for EarlyStopping lacks key(s) {missing}. Received: keys "
                f"{sorted(state)}. Pass the dict returned by `EarlyStopping.state_dict()`."
            )
        for key in ("monitor", "mode"):
            if key in state and state[key] != getattr(self, key):
                raise ConfigError(
                    f"`{key}` of the saved EarlyStopping state differs from this callback. "
                    f"Received: {key}={state[key]!r}, but this callback has "
                    f"{key}={getattr(self, key)!r}. Resume with the same EarlyStopping settings."
                )
        self.best = None if state["best"] is None else float(state["best"])
        self.best_step = None if state["best_step"] is None else int(state["best_step"])
        self.wait = int(state["wait"])
        stopped = state.get("stopped_step")
        self.stopped_step = None if stopped is None else int(stopped)

    def __repr__(self) -> str:
        return (
            f"EarlyStopping(monitor={self.monitor!r}, patience={self.patience}, "
            f"mode={self.mode!r}, min_delta={self.min_delta}"
            f"{', restore_best=True' if self.restore_best else ''})"
        )
