"""`ReduceLROnPlateau`: scale the learning rate down when a validation metric stalls."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any, ClassVar

from pipekit_train.core._errors import ConfigError

from ._monitor import improved, monitored_value

__all__ = ["ReduceLROnPlateau"]


def _number(name: str, value: Any, *, low: float, high: float | None = None, fix: str) -> float:
    ok = (
        not isinstance(value, bool)
        and isinstance(value, numbers.Real)
        and math.isfinite(value)
        and float(value) >= low
        and (high is None or float(value) < high)
    )
    if not ok:
        bound = f">= {low:g}" + ("" if high is None else f" and < {high:g}")
        raise ConfigError(
            f"`{name}` must be a finite number {bound}. Received: {name}={value!r}. {fix}"
        )
    return float(value)


def _count(name: str, value: Any, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ConfigError(f"`{name}` must be an integer >= 0. Received: {name}={value!r}. {fix}")
    return int(value)


class ReduceLROnPlateau:
    """Multiply the learning rate by `factor` when `monitor` stops improving.

    Keras's `ReduceLROnPlateau` with the same argument names and rules, acting on the
    validations core runs (`on_validation_end`) instead of on epochs. A value improves
    when it beats the best so far by more than `min_delta` (`value < best - min_delta`
    in `"min"` mode, `value > best + min_delta` in `"max"` mode). After `patience`
    validations in a row without improvement (outside the cooldown), the rate becomes
    `max(rate * factor, min_lr)`, the wait starts again, and `cooldown` validations
    follow in which stalling is not counted. A rate already at or below `min_lr` is left
    as it is.

    The rate changes through the run's learning-rate scale (`RunState.set_lr_scale`),
    so it works the same on every backend and with a schedule: the effective rate is
    `schedule(step) * scale`, and `min_lr` bounds the effective rate at the reduction
    (a schedule that keeps decaying afterwards may go below it). `LearningRateLogger`
    and `state.learning_rate` show the scaled rate. The counters (`best`, `wait`,
    `cooldown_counter`, `num_reductions`) are in `state_dict()` and the scale is in the
    run state, so a resumed run reduces at exactly the same steps.

    Args:
        monitor: the metric to watch, as named in `state.metrics` (validation metrics
            carry a `val_` prefix).
        factor: the multiplier of a reduction, in (0, 1).
        patience: validations without improvement before a reduction.
        verbose: print a line at each reduction (0: silent).
        mode: `"min"`, `"max"`, or `"auto"` (`"max"` when `monitor` names an accuracy or
            `r2`, else `"min"`).
        min_delta: the smallest change that counts as an improvement (>= 0).
        cooldown: validations after a reduction before stalling counts again.
        min_lr: the lower bound of the effective learning rate (>= 0).

    Raises:
        ConfigError: a bad argument here, or (at validation time) a `monitor` the
            validation did not produce; `min_lr > 0` on a run whose backend reports no
            learning rate (a framework-native optimizer object).
    """

    produces: tuple[str, ...] = ()
    """The metric names it adds to the run (none; see `Callback.produces`)."""

    adjusts_learning_rate: ClassVar[bool] = True
    """Tells core to build the backend's step with the learning-rate scale."""

    def __init__(
        self,
        monitor: str = "val_loss",
        factor: float = 0.1,
        patience: int = 10,
        verbose: int = 0,
        mode: str = "auto",
        min_delta: float = 1e-4,
        cooldown: int = 0,
        min_lr: float = 0.0,
    ) -> None:
        if not isinstance(monitor, str) or not monitor:
            raise ConfigError(
                f"`monitor` must be a metric name. Received: monitor={monitor!r}. "
                "Pass e.g. monitor='val_loss'."
            )
        self.factor = _number(
            "factor", factor, low=0.0, high=1.0, fix="Pass e.g. factor=0.5 to halve the rate."
        )
        if self.factor == 0.0:
            raise ConfigError(
                f"`factor` must be > 0 and < 1. Received: factor={factor!r}. "
                "Pass e.g. factor=0.5 to halve the rate."
            )
        self.patience = _count("patience", patience, "Pass e.g. patience=10.")
        self.cooldown = _count("cooldown", cooldown, "Pass e.g. cooldown=0.")
        self.verbose = _count("verbose", verbose, "Pass verbose=0 or verbose=1.")
        self.min_delta = _number("min_delta", min_delta, low=0.0, fix="Pass e.g. min_delta=1e-4.")
        self.min_lr = _number("min_lr", min_lr, low=0.0, fix="Pass e.g. min_lr=0.0.")
        if mode not in ("min", "max", "auto"):
            raise ConfigError(
                f"`mode` must be 'min', 'max' or 'auto'. Received: mode={mode!r}. "
                "Use 'min' for losses and errors, 'max' for scores such as accuracy."
            )
        if mode == "auto":
            name = monitor.removeprefix("val_")
            mode = "max" if name == "r2" or "acc" in name else "min"
        self.monitor: str = monitor
        self.mode: str = mode
        self.best: float | None = None
        self.wait: int = 0
        self.cooldown_counter: int = 0
        self.num_reductions: int = 0
        self.reduced_at: list[int] = []

    def _improved(self, value: float) -> bool:
        return improved(value, self.best, mode=self.mode, min_delta=self.min_delta)

    def on_train_start(self, state: Any) -> None:
        """Refuse `min_lr > 0` when the backend reports no learning rate."""
        if self.min_lr > 0 and state.learning_rate is None:
            raise ConfigError(
                "`min_lr` needs the learning rate, which this run's optimizer does not "
                f"report. Received: min_lr={self.min_lr!r}. Pass min_lr=0.0, or describe "
                "the optimizer with a dict optimizer_config."
            )

    def on_validation_end(self, state: Any) -> None:
        """Update the best value and the counters; reduce the rate when patience runs out."""
        metrics = state.metrics
        value = monitored_value(metrics, self.monitor, "ReduceLROnPlateau")
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.wait = 0
        if self._improved(value):
            self.best, self.wait = value, 0
            return
        if self.cooldown_counter > 0:
            return
        self.wait += 1
        if self.wait < self.patience:
            return
        self._reduce(state)

    def _reduce(self, state: Any) -> None:
        scale = float(state.lr_scale)
        lr = state.learning_rate
        if lr is None:
            new_scale = scale * self.factor
        else:
            lr = float(lr)
            if not lr > self.min_lr:
                return  # already at the floor: nothing to reduce, keep waiting
            new_scale = scale * self.factor
            if lr * self.factor < self.min_lr:
                new_scale = scale * (self.min_lr / lr)
        state.set_lr_scale(new_scale)
        self.cooldown_counter, self.wait = self.cooldown, 0
        self.num_reductions += 1
        self.reduced_at.append(int(state.step))
        if self.verbose:
            now = state.learning_rate
            shown = "" if now is None else f" to {float(now):.6g}"
            print(
                f"ReduceLROnPlateau: step {int(state.step)}: `{self.monitor}` did not improve "
                f"for {self.patience} validation(s); learning rate scaled by "
                f"{new_scale / scale:.6g}{shown}."
            )

    def state_dict(self) -> dict[str, Any]:
        """JSON state: `best`, `wait`, `cooldown_counter`, `num_reductions`, `reduced_at`
        (+ the settings, checked on load)."""
        return {
            "monitor": self.monitor,
            "mode": self.mode,
            "factor": self.factor,
            "best": self.best,
            "wait": self.wait,
            "cooldown_counter": self.cooldown_counter,
            "num_reductions": self.num_reductions,
            "reduced_at": list(self.reduced_at),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the state saved by `state_dict()`.

        Raises:
            ConfigError: the state was saved with another `monitor`, `mode` or `factor`,
                or lacks a key.
        """
        missing = [k for k in ("best", "wait", "cooldown_counter") if k not in state]
        if missing:
            raise ConfigError(
                f"`state` for ReduceLROnPlateau lacks key(s) {missing}. Received: keys "
                f"{sorted(state)}. Pass the dict returned by `ReduceLROnPlateau.state_dict()`."
            )
        for key in ("monitor", "mode", "factor"):
            if key in state and state[key] != getattr(self, key):
                raise ConfigError(
                    f"`{key}` of the saved ReduceLROnPlateau state differs from this callback. "
                    f"Received: {key}={state[key]!r}, but this callback has "
                    f"{key}={getattr(self, key)!r}. Resume with the same settings."
                )
        self.best = None if state["best"] is None else float(state["best"])
        self.wait = int(state["wait"])
        self.cooldown_counter = int(state["cooldown_counter"])
        self.num_reductions = int(state.get("num_reductions", 0))
        self.reduced_at = [int(s) for s in state.get("reduced_at", [])]

    def __repr__(self) -> str:
        return (
            f"ReduceLROnPlateau(monitor={self.monitor!r}, factor={self.factor}, "
            f"patience={self.patience}, mode={self.mode!r}, min_delta={self.min_delta}, "
            f"cooldown={self.cooldown}, min_lr={self.min_lr})"
        )
