"""`CalibrationMonitor`: a posterior's calibration, measured during training.

A callback that runs every diagnostic on a fixed set of simulations every `n` optimizer
updates, with the current weights (through the evaluator validation uses), and logs the
scalars to the metric writers. The run's model is read as a posterior by
`posterior_forward` (`pipekit_train.core.rollout`), as `TrainingArtifact.calibration` reads
the trained one.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.diagnostics import CalibrationReport, run_calibration
from pipekit_train.core.diagnostics._posterior import check_calibration_options
from pipekit_train.core.rollout._posterior import (
    check_posterior_loss,
    posterior_forward,
    simulations_of,
)

__all__ = ["CalibrationMonitor"]


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
        #: the metric names it adds to the run: `<prefix>*` (see `Callback.produces`)
        self.produces: tuple[str, ...] = (f"{prefix}*",)
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
        check_posterior_loss(self._loss)

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
