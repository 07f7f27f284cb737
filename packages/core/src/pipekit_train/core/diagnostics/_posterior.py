"""Draws and log-densities from a posterior, and every calibration diagnostic at once.

A *posterior* here is what maps a batch of observations to a distribution over the
parameters:

- an object with `distribution(x)` (a `NeuralForward` with a Gaussian or mixture head), or
- a callable `x -> distribution`.

The distribution (`Gaussian`, `Mixture`, or any object alike) has `sample(rng, n)`
returning `(n, batch, D)` and, optionally, `log_prob(value)` returning `(n, batch)` (or
`(n, batch, D)` per element, as `Gaussian` does: the elements are summed). Without
`log_prob`, the highest-density coverage is left out. A posterior known only through
samples goes to the array functions (`sbc_ranks`, `central_coverage`, `tarp`) directly.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipekit_train.core._checks import check_seed, is_int, positive_int
from pipekit_train.core._errors import ConfigError

from ._coverage import CoverageCurve, central_coverage, hpd_coverage
from ._inputs import (
    MIN_POSTERIOR_SAMPLES,
    MIN_SIMULATIONS,
    check_probability,
    check_samples_and_theta,
)
from ._sbc import SBCCheck, check_sbc, sbc_ranks
from ._tarp import TARPResult, tarp

__all__ = [
    "CalibrationReport",
    "check_calibration_options",
    "posterior_samples",
    "run_calibration",
]


def _check_posterior(posterior: Any) -> None:
    if not callable(getattr(posterior, "distribution", None)) and not callable(posterior):
        raise ConfigError(
            "`posterior` must map observations to a distribution: an object with "
            "`distribution(x)` (a NeuralForward with a Gaussian or mixture head) or a "
            f"callable `x -> distribution`. Received: posterior={type(posterior).__name__}. "
            "For a posterior known only through samples, call sbc_ranks/central_coverage/"
            "tarp on the samples."
        )


def _distribution(posterior: Any, x: np.ndarray) -> Any:
    method = getattr(posterior, "distribution", None)
    dist = method(x) if callable(method) else posterior(x)
    if not callable(getattr(dist, "sample", None)):
        raise ConfigError(
            "The posterior must return a distribution with `sample(rng, n)` (like Gaussian "
            f"or Mixture). Received: {type(dist).__name__} from posterior(x)."
        )
    return dist


def _sample(dist: Any, rng: np.random.Generator, n: int, batch: int) -> np.ndarray:
    draws = np.asarray(dist.sample(rng, n), dtype=np.float64)
    if draws.ndim == 2:
        draws = draws[..., None]
    if draws.ndim != 3 or draws.shape[:2] != (n, batch):
        raise ConfigError(
            f"`sample(rng, {n})` must return draws (n, batch, num_parameters) for a batch of "
            f"{batch} observations. Received: shape {draws.shape}."
        )
    return draws


def _log_prob(dist: Any, value: np.ndarray) -> np.ndarray:
    lp = np.asarray(dist.log_prob(value), dtype=np.float64)
    if lp.shape == value.shape:  # per element (Gaussian): the joint density is their sum
        lp = lp.sum(axis=-1)
    if lp.shape != value.shape[:-1]:
        raise ConfigError(
            f"`log_prob(value)` must return one log-density per point: shape "
            f"{value.shape[:-1]} for value of shape {value.shape}. Received: shape {lp.shape}."
        )
    return lp


def _rows(x: Any) -> np.ndarray:
    array = np.asarray(x)
    if array.ndim < 1 or len(array) == 0:
        raise ConfigError(
            f"`x` must be a batch of observations (num_simulations, ...). Received: "
            f"x.shape={array.shape}."
        )
    return array


def posterior_samples(
    posterior: Any, x: Any, num_samples: int, *, seed: int = 0, batch_size: int = 256
) -> np.ndarray:
    """`num_samples` posterior draws at each observation, samples first.

    Args:
        posterior: an object with `distribution(x)` or a callable `x -> distribution`
            (see the module docstring).
        x: the observations `(N, ...)`.
        num_samples: `S`, draws per observation.
        seed: seeds the draws (one generator, used batch after batch).
        batch_size: observations per call of the posterior (bounds the memory).

    Returns:
        float64 draws `(S, N, D)`.
    """
    _check_posterior(posterior)
    xs = _rows(x)
    num_samples = positive_int("num_samples", num_samples)
    batch_size = positive_int("batch_size", batch_size)
    rng = np.random.default_rng(check_seed(seed))
    chunks = []
    for start in range(0, len(xs), batch_size):
        chunk = xs[start : start + batch_size]
        chunks.append(_sample(_distribution(posterior, chunk), rng, num_samples, len(chunk)))
    return np.concatenate(chunks, axis=1)


@dataclass(frozen=True, eq=False)
class CalibrationReport:
    """Every calibration diagnostic of one posterior on one set of simulations.

    Attributes:
        sbc: simulation-based calibration, per parameter.
        coverage_central: expected coverage of the central intervals, per parameter.
        coverage_hpd: expected coverage of the highest-density regions (None when the
            distribution has no `log_prob`).
        tarp: TARP's curve and summaries.
        tolerance: the coverage tolerance `passed` uses.
    """

    sbc: SBCCheck
    coverage_central: CoverageCurve
    coverage_hpd: CoverageCurve | None
    tarp: TARPResult
    tolerance: float

    @property
    def passed(self) -> bool:
        """SBC inside its band, coverage within `tolerance` at 50/68/95%, TARP's KS test
        not rejecting (at the SBC's `alpha`)."""
        curves = [self.coverage_central, self.coverage_hpd]
        coverage_ok = all(c.check(tolerance=self.tolerance).passed for c in curves if c)
        return self.sbc.passed and coverage_ok and self.tarp.passed(self.sbc.alpha)

    def metrics(self, prefix: str = "") -> dict[str, float]:
        """The scalars, flat, for a metric writer or a registry record.

        Keys: `sbc_chi2_pvalue_min`, `sbc_ks_pvalue_min`, `sbc_inside_band`,
        `coverage_central_50/68/95`, `coverage_hpd_50/68/95`, `tarp_atc`,
        `tarp_ks_pvalue`, `calibrated` (1.0 or 0.0), each after `prefix`.
        """
        out = {**self.sbc.metrics(), **self.coverage_central.metrics()}
        if self.coverage_hpd is not None:
            out.update(self.coverage_hpd.metrics())
        out.update(self.tarp.metrics())
        out["calibrated"] = float(self.passed)
        return {f"{prefix}{k}": v for k, v in out.items()}

    def plot(self, directory: str | os.PathLike[str]) -> dict[str, str]:
        """Write `sbc.png`, `coverage.png` and `tarp.png` into `directory` (made if
        missing; needs the `[plot]` extra). Returns name -> path."""
        os.makedirs(directory, exist_ok=True)
        from ._plots import coverage_figure, save_png

        paths = {
            "sbc": self.sbc.plot(os.path.join(directory, "sbc.png")),
            "tarp": self.tarp.plot(os.path.join(directory, "tarp.png")),
        }
        curves = [c for c in (self.coverage_central, self.coverage_hpd) if c is not None]
        paths["coverage"] = save_png(
            coverage_figure(*curves), os.path.join(directory, "coverage.png")
        )
        return paths


def check_calibration_options(
    num_simulations: int, *, num_samples: Any, seed: Any, alpha: Any, tolerance: Any
) -> None:
    """Refuse, before any draw, what `run_calibration` cannot work with.

    Raises:
        ConfigError: fewer than 20 simulations or draws, a bad seed, `alpha` or `tolerance`.
    """
    if num_simulations < MIN_SIMULATIONS:
        raise ConfigError(
            f"Calibration diagnostics need at least {MIN_SIMULATIONS} simulations. Received: "
            f"num_simulations={num_simulations}. Simulate more (a few hundred give a usable "
            "test)."
        )
    if not is_int(num_samples) or num_samples < MIN_POSTERIOR_SAMPLES:
        raise ConfigError(
            f"`num_samples` must be an int >= {MIN_POSTERIOR_SAMPLES}. Received: "
            f"num_samples={num_samples!r}. Use 100 or more."
        )
    check_seed(seed)
    check_probability("alpha", alpha)
    check_probability("tolerance", tolerance)


def run_calibration(
    posterior: Any,
    theta: Any,
    x: Any,
    *,
    num_samples: int = 200,
    seed: int = 0,
    alpha: float = 0.05,
    tolerance: float = 0.05,
    parameter_names: Sequence[str] | None = None,
    batch_size: int = 256,
) -> CalibrationReport:
    """SBC, expected coverage (central and, with `log_prob`, HPD) and TARP of a posterior.

    Args:
        posterior: an object with `distribution(x)` or a callable `x -> distribution`.
        theta: the true parameters `(N, D)` the observations were simulated from, drawn
            from the prior the posterior was trained under (a held-out set).
        x: the observations `(N, ...)`.
        num_samples: `S`, posterior draws per observation (≥ 20).
        seed: seeds the draws, the SBC band and TARP's reference points.
        alpha: the level of the SBC band and of the KS tests.
        tolerance: the accepted `|coverage - level|` at 50/68/95% for `passed`.
        parameter_names: names for plots (default `theta_0`, …).
        batch_size: observations per call of the posterior.

    Returns:
        A `CalibrationReport`.

    Raises:
        ConfigError: a posterior that is not one of the two kinds, `x` and `theta` of
            different lengths, fewer than 20 simulations or draws, bad levels.
    """
    _check_posterior(posterior)
    t = np.asarray(theta, dtype=np.float64)
    t = t[:, None] if t.ndim == 1 else t
    xs = _rows(x)
    if t.ndim != 2 or len(t) != len(xs):
        raise ConfigError(
            "`theta` must be (num_simulations, num_parameters) with one row per observation "
            f"in `x`. Received: theta.shape={np.shape(theta)}, x.shape={xs.shape}."
        )
    check_calibration_options(
        len(t), num_samples=num_samples, seed=seed, alpha=alpha, tolerance=tolerance
    )
    batch_size = positive_int("batch_size", batch_size)
    rng = np.random.default_rng(seed)
    draws, lp_draws, lp_theta = [], [], []
    has_log_prob = True
    for start in range(0, len(xs), batch_size):
        chunk, truth = xs[start : start + batch_size], t[start : start + batch_size]
        dist = _distribution(posterior, chunk)
        s = _sample(dist, rng, num_samples, len(chunk))
        if s.shape[-1] != t.shape[1]:
            raise ConfigError(
                f"The posterior draws {s.shape[-1]} parameters but `theta` has {t.shape[1]}. "
                f"Received: draws of shape {s.shape}, theta.shape={t.shape}."
            )
        draws.append(s)
        has_log_prob = has_log_prob and callable(getattr(dist, "log_prob", None))
        if has_log_prob:
            lp_draws.append(_log_prob(dist, s))
            lp_theta.append(_log_prob(dist, truth))
    samples, t = check_samples_and_theta(np.concatenate(draws, axis=1), t)
    hpd = None
    if has_log_prob:
        hpd = hpd_coverage(np.concatenate(lp_draws, axis=1), np.concatenate(lp_theta))
    sbc = check_sbc(
        sbc_ranks(samples, t),
        num_samples,
        alpha=alpha,
        parameter_names=parameter_names,
        seed=seed,
    )
    return CalibrationReport(
        sbc=sbc,
        coverage_central=central_coverage(samples, t, parameter_names=sbc.parameter_names),
        coverage_hpd=hpd,
        tarp=tarp(samples, t, seed=seed),
        tolerance=float(tolerance),
    )
