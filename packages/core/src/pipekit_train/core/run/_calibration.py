"""Calibration of a trained posterior: on held-out simulations, and during training.

- `posterior_forward(model, normalizer, loss)`: the `NeuralForward` a run's model is as a
  posterior (the head read from the loss: `gaussian_nll` → Gaussian, `mixture_nll` →
  mixture), for `pipekit_train.core.diagnostics.run_calibration`.
- `CalibrationMonitor`: a callback that runs every diagnostic on a fixed set of
  simulations every `n` optimizer updates, with the current weights (through the
  evaluator validation uses), and logs the scalars to the metric writers.

`TrainingArtifact.calibration` / `evaluate(..., calibration=True)` use the first.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.data import is_core_dataset, make_batches
from pipekit_train.core.diagnostics import CalibrationReport, run_calibration
from pipekit_train.core.diagnostics._posterior import check_calibration_options
from pipekit_train.core.distributions._heads import head_for_loss, head_options_for_loss
from pipekit_train.core.rollout._cycle import NeuralForward

__all__ = [
    "CalibrationMonitor",
    "check_posterior_loss",
    "posterior_forward",
    "simulations_of",
]


def simulations_of(data: Any, *, field: str = "data") -> tuple[np.ndarray, np.ndarray]:
    """`(x, theta)` of a sized pipekit dataset whose samples hold `x` (the observation)
    and `y` (the parameters it was simulated from), read in order."""
    if not is_core_dataset(data) or not hasattr(data, "__len__") or len(data) == 0:
        raise ConfigError(
            f"`{field}` must be a non-empty sized pipekit dataset of simulations with 'x' "
            "(observations) and 'y' (parameters), e.g. as_supervised(sims, input='x', "
            f"target='theta'). Received: {field}={type(data).__name__}."
        )
    keys = set(data[0])
    if not {"x", "y"} <= keys:
        raise ConfigError(
            f"`{field}` samples must hold 'x' and 'y'. Received: keys {sorted(keys)}. "
            "Use as_supervised(data, input=..., target=...) to name them."
        )
    xs, ys = [], []
    for batch in make_batches(
        data, 1024, seed=0, shuffle=False, drop_remainder=False, num_epochs=1
    ):
        xs.append(np.asarray(batch["x"]))
        ys.append(np.asarray(batch["y"]))
    return np.concatenate(xs), np.concatenate(ys)


def _head(loss: Any, head: str | None, head_options: Mapping[str, Any] | None) -> tuple[str, dict]:
    head = head or head_for_loss(loss)
    if head not in ("gaussian", "mixture", "flow"):
        raise ConfigError(
            "Calibration needs a posterior: a model trained with `gaussian_nll`, "
            f"`mixture_nll` or `flow_nll`. Received: loss={loss!r}, head={head!r}. Train with "
            "one of those losses, or pass head='gaussian', head='mixture' or head='flow' (with "
            "head_options)."
        )
    options = dict(head_options or head_options_for_loss(loss) or {})
    return head, options


def check_posterior_loss(loss: Any) -> None:
    """Refuse a run loss that implies no posterior (not `gaussian_nll`, `mixture_nll` or
    `flow_nll`)."""
    _head(loss, None, None)


def posterior_forward(
    model: Callable[[np.ndarray], Any],
    normalizer: Any,
    loss: Any,
    *,
    state_ndim: int = 1,
    head: str | None = None,
    head_options: Mapping[str, Any] | None = None,
) -> NeuralForward:
    """A run's model as a posterior `x -> distribution` in the parameters' units.

    Args:
        model: the model operator (raw output in the normalised units).
        normalizer: the run's `Normalizer` (or None).
        loss: the run's loss description (names the head).
        state_ndim: the axes of one observation (2 for a set of points `(n, d)`).
        head: override the head the loss implies.
        head_options: override the mixture's options.

    Raises:
        ConfigError: the loss implies no distribution (`head="point"`).
    """
    name, options = _head(loss, head, head_options)
    return NeuralForward(model, normalizer=normalizer, head=name, state_ndim=state_ndim, **options)


class CalibrationMonitor:
    """Run the calibration diagnostics every `every_n_steps` updates on fixed simulations.

    ```python
    monitor = CalibrationMonitor(held_out, every_n_steps=500, num_samples=100)
    TrainingLoop(..., loss=losses.mixture_nll(n_components=8), callbacks=[monitor])
    ```

    At each due step the model (current weights, through validation's evaluator: the
    moving average when the run keeps one) is read as a posterior, `run_calibration`
    draws `num_samples` parameters for every simulation, and the scalars of its report
    (`CalibrationReport.metrics`) go to the metric writers with `prefix`:
    `cal_sbc_chi2_pvalue_min`, `cal_coverage_hpd_68`, `cal_tarp_atc`, `cal_calibrated`, ….
    The last report is kept (`last_report`) for its plots.

    Args:
        data: the simulations: a sized pipekit dataset with `x` and `y` (the parameters),
            or the observations `x` `(N, ...)` with `theta` given.
        theta: the parameters `(N, D)` when `data` is an array of observations.
        every_n_steps: run when `step % every_n_steps == 0`.
        num_samples: posterior draws per simulation (≥ 20).
        seed: seeds the draws (the same at every step, so steps differ only by weights).
        prefix: put before every metric name.
        alpha: the SBC band's and the KS tests' level.
        tolerance: the coverage tolerance of `calibrated`.

    Raises:
        ConfigError: fewer than 20 simulations, `x`/`theta` lengths that differ, a bad
            `every_n_steps`; at the start of training, a loss that implies no posterior.
    """

    def __init__(
        self,
        data: Any,
        theta: Any = None,
        *,
        every_n_steps: int,
        num_samples: int = 100,
        seed: int = 0,
        prefix: str = "cal_",
        alpha: float = 0.05,
        tolerance: float = 0.05,
    ) -> None:
        if theta is None:
            x, t = simulations_of(data)
        else:
            x, t = np.asarray(data), np.asarray(theta, dtype=np.float64)
        if t.ndim == 1:
            t = t[:, None]
        if x.ndim < 2 or t.ndim != 2 or len(x) != len(t):
            raise ConfigError(
                "`data` (the observations) and `theta` must hold one row per simulation. "
                f"Received: x.shape={x.shape}, theta.shape={t.shape}."
            )
        if (
            isinstance(every_n_steps, bool)
            or not isinstance(every_n_steps, numbers.Integral)
            or every_n_steps < 1
        ):
            raise ConfigError(
                f"`every_n_steps` must be an integer >= 1. Received: "
                f"every_n_steps={every_n_steps!r}. Pass e.g. every_n_steps=500."
            )
        if not isinstance(prefix, str):
            raise ConfigError(f"`prefix` must be a string. Received: prefix={prefix!r}.")
        self.x: np.ndarray = x
        self.theta: np.ndarray = t
        self.every_n_steps: int = int(every_n_steps)
        self.prefix: str = prefix
        self._options: dict[str, Any] = {
            "num_samples": num_samples,
            "seed": seed,
            "alpha": alpha,
            "tolerance": tolerance,
        }
        check_calibration_options(len(t), **self._options)  # before training, not at step n
        self.last_report: CalibrationReport | None = None
        self._loss: Any = None

    def on_train_start(self, state: Any) -> None:
        """Check that the run's loss names a posterior head."""
        self._loss = state.plan.get("loss")
        _head(self._loss, None, None)

    def on_step_end(self, state: Any) -> None:
        """Run the diagnostics on every `every_n_steps`-th step and log their scalars."""
        if state.step % self.every_n_steps:
            return
        dim = self.theta.shape[1]

        def model(x_norm: np.ndarray) -> np.ndarray:
            x_in = np.asarray(x_norm, dtype=np.float32)
            return state.predict({"x": x_in, "y": np.zeros((len(x_in), dim), np.float32)})

        forward = posterior_forward(model, state.normalizer, self._loss, state_ndim=self.x.ndim - 1)
        self.last_report = run_calibration(forward, self.theta, self.x, **self._options)
        state.log(self.last_report.metrics(prefix=self.prefix))

    def __repr__(self) -> str:
        return (
            f"CalibrationMonitor(simulations={len(self.theta)}, every_n_steps={self.every_n_steps})"
        )
