"""`lr_find`: the learning-rate range test, on any backend.

A short run from the loop's initial weights in which the learning rate grows
geometrically from `min_lr` to `max_lr` (core's `exponential` schedule, so every backend
follows the same curve), recording the training loss at every step. The loss first falls
as the rate becomes useful, then blows up once it is too large; the suggestion is the
rate where the smoothed loss falls fastest (per decade of learning rate) before its
minimum. The run writes no checkpoint, metric file or validation: the loop's checkpoint
directory is left as it was.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pipekit_train.core._errors import ConfigError
from pipekit_train.core._imports import optional_import
from pipekit_train.core.spec._schedules import learning_rate_at

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["LRFindResult", "lr_find"]


@dataclass(frozen=True)
class LRFindResult:
    """The curve of a learning-rate range test.

    Attributes:
        learning_rates: the rate of each recorded step's update.
        losses: the training loss of each step.
        smoothed: the losses after bias-corrected exponential smoothing.
        suggestion: the suggested learning rate.
        stopped_early: whether the test stopped because the loss diverged.
        backend: the backend that ran it.
    """

    learning_rates: list[float]
    losses: list[float]
    smoothed: list[float]
    suggestion: float
    stopped_early: bool
    backend: str

    def figure(self) -> Figure:
        """Loss against learning rate (log axis), with the suggestion marked."""
        optional_import("matplotlib", extra="plot", package="pipekit-train-core")
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(6.5, 4), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        ax.plot(self.learning_rates, self.losses, color="0.75", lw=1, label="loss")
        ax.plot(self.learning_rates, self.smoothed, color="C0", lw=2, label="smoothed")
        ax.axvline(self.suggestion, color="C3", ls="--", label=f"suggestion {self.suggestion:.2g}")
        ax.set_xscale("log")
        finite = [v for v in self.smoothed if math.isfinite(v)]
        if finite:
            low, start = min(finite), finite[0]
            ax.set_ylim(low - 0.1 * abs(start - low), start + 0.5 * abs(start - low) + 1e-12)
        ax.set_xlabel("learning rate")
        ax.set_ylabel("training loss")
        ax.set_title(f"Learning-rate range test ({self.backend})")
        ax.legend(loc="best")
        fig.tight_layout()
        return fig

    def plot(self, path: str | os.PathLike[str]) -> str:
        """Save `figure()` as an image (PNG by extension) and return the path."""
        fig = self.figure()
        fig.savefig(os.fspath(path))
        return os.fspath(path)


class _StopOnDivergence:
    """Requests a stop once the smoothed loss exceeds `factor` times its best so far."""

    def __init__(self, beta: float, factor: float):
        self.beta, self.factor = beta, factor
        self.avg, self.best, self.n = 0.0, math.inf, 0
        self.diverged = False

    def on_step_end(self, state: Any) -> None:
        loss = state.metrics.get("loss")
        if loss is None:
            return
        if not math.isfinite(loss):
            self.diverged = True
            state.request_stop("lr_find: the loss is not finite")
            return
        self.n += 1
        self.avg = self.beta * self.avg + (1 - self.beta) * loss
        smooth = self.avg / (1 - self.beta**self.n)
        self.best = min(self.best, smooth)
        if self.n > 5 and smooth > self.factor * self.best:
            self.diverged = True
            state.request_stop("lr_find: the loss diverged")


def _smooth(values: list[float], beta: float) -> list[float]:
    out, avg = [], 0.0
    for i, v in enumerate(values, start=1):
        if not math.isfinite(v):
            out.append(math.nan)
            continue
        avg = beta * avg + (1 - beta) * v
        out.append(avg / (1 - beta**i))
    return out


def suggest(learning_rates: list[float], smoothed: list[float]) -> float:
    """The rate where the smoothed loss falls fastest per decade, before its minimum.

    The slope at each step is taken over a window of about a tenth of the curve (so the
    noise of single steps does not decide), and the first tenth of the steps — where the
    smoothing has seen few values — is not a candidate.
    """
    lr = np.asarray(learning_rates, dtype=np.float64)
    loss = np.asarray(smoothed, dtype=np.float64)
    finite = np.isfinite(loss)
    if finite.sum() < 3:
        return float(lr[0])
    best = int(np.nanargmin(np.where(finite, loss, np.inf)))
    n = len(lr)
    half = max(1, n // 20)
    first = min(n // 10, best)
    if best - first < 1:
        return float(lr[best])
    x = np.log10(lr)
    slopes = []
    for i in range(first, best + 1):
        a, b = max(0, i - half), min(best, i + half)
        slopes.append((loss[b] - loss[a]) / (x[b] - x[a]) if b > a else np.inf)
    return float(lr[first + int(np.argmin(slopes))])


def lr_find(
    loop: Any,
    *,
    min_lr: float = 1e-7,
    max_lr: float = 10.0,
    num_steps: int = 100,
    smoothing: float = 0.9,
    diverge_factor: float = 4.0,
) -> LRFindResult:
    """Run a learning-rate range test with a loop's model, data, loss and optimizer.

    ```python
    from pipekit_train.core import lr_find

    result = lr_find(loop, min_lr=1e-5, max_lr=1.0, num_steps=100)
    result.suggestion        # e.g. 0.0123
    result.plot("lr_find.png")
    ```

    The test starts from the loop's initial weights (the loop itself is not run and its
    checkpoint directory is not touched) and uses its optimizer with the learning rate
    replaced by a geometric ramp from `min_lr` to `max_lr` over `num_steps` updates;
    validation, checkpoints, writers and callbacks are left out. It stops early once the
    smoothed loss exceeds `diverge_factor` times its best value (or is not finite).

    Args:
        loop: a `TrainingLoop` (with a dict `optimizer_config`).
        min_lr: the first learning rate.
        max_lr: the last learning rate (reached at `num_steps`).
        num_steps: optimizer updates of the test.
        smoothing: the exponential smoothing factor of the loss (0 ≤ smoothing < 1).
        diverge_factor: stop when the smoothed loss exceeds this multiple of its best.

    Returns:
        An `LRFindResult` with the curve and the suggestion.

    Raises:
        ConfigError: bad arguments, or a backend-native optimizer object (before any work).
    """
    from ._training_loop import TrainingLoop

    plan = getattr(loop, "plan", None)
    if plan is None:
        raise ConfigError(f"`loop` must be a TrainingLoop. Received: loop={type(loop).__name__}.")
    for name, value in (("min_lr", min_lr), ("max_lr", max_lr)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(f"`{name}` must be a positive number. Received: {name}={value!r}.")
    if not max_lr > min_lr:
        raise ConfigError(
            f"`max_lr` must be larger than `min_lr`. Received: min_lr={min_lr!r}, "
            f"max_lr={max_lr!r}."
        )
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 5:
        raise ConfigError(f"`num_steps` must be an int >= 5. Received: num_steps={num_steps!r}.")
    if not 0 <= smoothing < 1:
        raise ConfigError(f"`smoothing` must be in [0, 1). Received: smoothing={smoothing!r}.")
    if not diverge_factor > 1:
        raise ConfigError(
            f"`diverge_factor` must be > 1. Received: diverge_factor={diverge_factor!r}."
        )
    config = plan.optimizer_config
    if not isinstance(config, Mapping):
        raise ConfigError(
            "lr_find needs a dict `optimizer_config` (it replaces the learning rate). "
            f"Received: optimizer_config={type(config).__name__}. Use e.g. "
            "{'name': 'adam'} with the hyperparameters of your optimizer."
        )
    ramp = {
        "schedule": "exponential",
        "init_value": float(min_lr),
        "transition_steps": int(num_steps),
        "decay_rate": float(max_lr) / float(min_lr),
    }
    guard = _StopOnDivergence(smoothing, diverge_factor)
    test = TrainingLoop(
        model=plan.model,
        data=plan.data,
        loss=plan.loss,
        optimizer_config={**dict(config), "learning_rate": ramp},
        batch_size=plan.batch_size,
        max_steps=num_steps,
        callbacks=[guard],
        seed=plan.seed,
        adapter=plan.adapter,
        sharding=plan.sharding,
        accumulate_grad_batches=plan.accumulate_grad_batches,
        on_nonfinite="ignore",
        shuffle=plan.shuffle,
        drop_remainder=plan.drop_remainder,
        normalizer=plan.normalizer,
        log_every_n_steps=num_steps,
        progress=False,
    )
    artifact = test.run()
    steps, losses = artifact.history.series("loss")
    rates = [learning_rate_at(ramp, int(s) - 1) for s in steps]
    smoothed = _smooth([float(v) for v in losses], smoothing)
    return LRFindResult(
        learning_rates=rates,
        losses=[float(v) for v in losses],
        smoothed=smoothed,
        suggestion=suggest(rates, smoothed),
        stopped_early=guard.diverged,
        backend=artifact.backend,
    )
