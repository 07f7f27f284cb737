"""Expected coverage: how often the true parameter lies in the posterior's credible region.

For a credibility level `c`, a calibrated posterior's `c` region holds the truth in a
fraction `c` of the simulations. Two kinds of region, both read from posterior draws:

- `hpd_coverage` (highest density, all parameters at once): the truth lies in the
  level-`c` highest-density region when fewer than a fraction `c` of the draws have a
  higher log-density than the truth. Needs `log_prob` of the draws and of the truth
  (sbi's expected coverage, which is SBC with `-log_prob` as the statistic).
- `central_coverage` (per parameter): the truth lies in the central `c` interval of that
  parameter's draws (between the `(1 - c)/2` and `(1 + c)/2` quantiles). Needs draws only.

Each simulation is reduced to its *credibility* `u` in (0, 1): the smallest level whose
region holds the truth, `u = (r + 1/2) / (S + 1)` with `r` the rank of the truth's
statistic among the `S` draws (for the central interval, `|2u' - 1|` with `u'` the SBC
one). The coverage at `c` is the fraction of simulations with `u ≤ c`; calibrated, it is
`c` to within `1 / (S + 1)` plus the sampling error `sqrt(c (1 - c) / N)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError

from ._inputs import (
    MIN_POSTERIOR_SAMPLES,
    MIN_SIMULATIONS,
    check_levels,
    check_parameter_names,
    check_samples_and_theta,
)
from ._ranks import count_below

__all__ = [
    "CHECK_LEVELS",
    "CoverageCheck",
    "CoverageCurve",
    "central_coverage",
    "check_coverage",
    "hpd_coverage",
]

#: The levels `check_coverage` reads by default.
CHECK_LEVELS = (0.5, 0.68, 0.95)
#: The curve's default levels: 0.01 … 0.99 and the checked ones.
DEFAULT_LEVELS = np.union1d(np.round(np.linspace(0.01, 0.99, 99), 2), CHECK_LEVELS)


@dataclass(frozen=True, eq=False)
class CoverageCheck:
    """The coverage at a few levels against a tolerance (from `check_coverage`).

    Attributes:
        levels: the nominal levels `(L,)`.
        coverage: the measured coverage `(L,)` (HPD) or `(L, D)` (central, per parameter).
        tolerance: the largest accepted `|coverage - level|`.
        passed: every level, every parameter, within the tolerance.
    """

    levels: np.ndarray
    coverage: np.ndarray
    tolerance: float
    passed: bool

    @property
    def error(self) -> np.ndarray:
        """`coverage - level`: negative for an over-confident posterior."""
        levels = self.levels if self.coverage.ndim == 1 else self.levels[:, None]
        return self.coverage - levels


@dataclass(frozen=True, eq=False)
class CoverageCurve:
    """Expected coverage as a function of the credibility level.

    Attributes:
        credibility: per simulation, the smallest level whose region holds the truth:
            `(N,)` for `method="hpd"`, `(N, D)` for `method="central"`.
        num_samples: `S`, the posterior draws per simulation.
        method: `"hpd"` (highest-density regions over all parameters) or `"central"`
            (central intervals, one curve per parameter).
        parameter_names: the parameters' names (`("all",)` for HPD).
    """

    credibility: np.ndarray
    num_samples: int
    method: str
    parameter_names: tuple[str, ...]

    @property
    def num_simulations(self) -> int:
        """`N`, the simulations the curve is measured on."""
        return int(self.credibility.shape[0])

    @property
    def levels(self) -> np.ndarray:
        """The default levels the curve is drawn at (0.01 … 0.99 with 0.5, 0.68, 0.95)."""
        return DEFAULT_LEVELS.copy()

    def coverage(self, levels: Any = None) -> np.ndarray:
        """The fraction of simulations whose level-`c` region holds the truth, per level.

        Args:
            levels: credibility levels in (0, 1) (default: `self.levels`).

        Returns:
            `(L,)` for HPD, `(L, D)` for central intervals.
        """
        lv = self.levels if levels is None else check_levels(levels)
        cred = self.credibility
        if cred.ndim == 1:
            return np.mean(cred[None, :] <= lv[:, None], axis=1)
        return np.mean(cred[None, :, :] <= lv[:, None, None], axis=1)

    def check(self, levels: Any = CHECK_LEVELS, *, tolerance: float = 0.05) -> CoverageCheck:
        """`check_coverage(self, levels, tolerance=tolerance)`."""
        return check_coverage(self, levels, tolerance=tolerance)

    def metrics(self, prefix: str | None = None) -> dict[str, float]:
        """Scalars for a metric writer: the coverage at 50/68/95% (the worst parameter's
        for central intervals, the one furthest from nominal)."""
        prefix = prefix or f"coverage_{self.method}"
        out: dict[str, float] = {}
        for level, cov in zip(CHECK_LEVELS, self.coverage(CHECK_LEVELS), strict=True):
            values = np.atleast_1d(cov)
            worst = values[np.argmax(np.abs(values - level))]
            out[f"{prefix}_{round(100 * level)}"] = float(worst)
        return out

    def figure(self, *, title: str | None = None) -> Any:
        """The coverage curve against the diagonal, with the band a calibrated posterior
        stays in (a matplotlib `Figure`; needs the `[plot]` extra)."""
        from ._plots import coverage_figure

        return coverage_figure(self, title=title)

    def plot(self, path: Any, *, title: str | None = None) -> str:
        """Draw `figure()` to a PNG at `path` and return the path."""
        from ._plots import save_png

        return save_png(self.figure(title=title), path)


def check_coverage(
    curve: CoverageCurve, levels: Any = CHECK_LEVELS, *, tolerance: float = 0.05
) -> CoverageCheck:
    """Whether the coverage at each level is within `tolerance` of the level.

    Args:
        curve: a `CoverageCurve` (from `hpd_coverage` or `central_coverage`).
        levels: the nominal levels to read (default 0.5, 0.68, 0.95).
        tolerance: the accepted `|coverage - level|` (0.05 by default; the sampling error
            alone is about `sqrt(0.25 / N)`, 0.016 for 1000 simulations).

    Raises:
        ConfigError: a curve of another type, levels outside (0, 1), a tolerance not in (0, 1).
    """
    if not isinstance(curve, CoverageCurve):
        raise ConfigError(
            "`curve` must be a CoverageCurve from hpd_coverage or central_coverage. "
            f"Received: curve={type(curve).__name__}."
        )
    if (
        isinstance(tolerance, bool)
        or not isinstance(tolerance, (int, float))
        or not (0 < tolerance < 1)
    ):
        raise ConfigError(
            f"`tolerance` must be in (0, 1). Received: tolerance={tolerance!r}. Use e.g. 0.05."
        )
    lv = check_levels(levels)
    cov = curve.coverage(lv)
    error = cov - (lv if cov.ndim == 1 else lv[:, None])
    return CoverageCheck(
        levels=lv,
        coverage=cov,
        tolerance=float(tolerance),
        passed=bool(np.all(np.abs(error) <= tolerance)),
    )


def hpd_coverage(log_prob_samples: Any, log_prob_theta: Any) -> CoverageCurve:
    """Expected coverage of the highest-density regions.

    Args:
        log_prob_samples: `(S, N)`: the posterior log-density of each draw
            (`log q(samples[s, i] | x_i)`).
        log_prob_theta: `(N,)`: the posterior log-density of the truth (`log q(θ_i | x_i)`).

    Returns:
        A `CoverageCurve` with `method="hpd"`.

    Raises:
        ConfigError: mismatched shapes, fewer than 20 simulations or draws, NaN values.
    """
    lp_s = np.asarray(log_prob_samples, dtype=np.float64)
    lp_t = np.asarray(log_prob_theta, dtype=np.float64)
    if lp_s.ndim != 2 or lp_t.ndim != 1 or lp_s.shape[1] != lp_t.shape[0]:
        raise ConfigError(
            "`log_prob_samples` must be (num_samples, num_simulations) and `log_prob_theta` "
            "(num_simulations,). Received: "
            f"log_prob_samples.shape={lp_s.shape}, log_prob_theta.shape={lp_t.shape}."
        )
    if lp_t.shape[0] < MIN_SIMULATIONS or lp_s.shape[0] < MIN_POSTERIOR_SAMPLES:
        raise ConfigError(
            f"Expected coverage needs at least {MIN_SIMULATIONS} simulations and "
            f"{MIN_POSTERIOR_SAMPLES} posterior draws each. Received: "
            f"num_samples={lp_s.shape[0]}, num_simulations={lp_t.shape[0]}. Simulate or "
            "draw more."
        )
    if np.isnan(lp_s).any() or np.isnan(lp_t).any():
        raise ConfigError(
            "`log_prob_samples` and `log_prob_theta` must not hold NaN. Received: "
            f"{int(np.isnan(lp_s).sum())} and {int(np.isnan(lp_t).sum())} NaN values."
        )
    # the draws denser than the truth: the truth's rank in -log q
    higher = count_below(-lp_s, -lp_t)
    s = lp_s.shape[0]
    return CoverageCurve((higher + 0.5) / (s + 1), s, "hpd", ("all",))


def central_coverage(
    samples: Any, theta: Any, *, parameter_names: Sequence[str] | None = None
) -> CoverageCurve:
    """Expected coverage of the central intervals, one curve per parameter.

    Args:
        samples: posterior draws `(S, N, D)` (samples first; `(S, N)` for one parameter).
        theta: the true parameters `(N, D)` (or `(N,)`).
        parameter_names: names for plots and metrics (default `theta_0`, …).

    Returns:
        A `CoverageCurve` with `method="central"`, credibility `(N, D)`.

    Raises:
        ConfigError: mismatched shapes, fewer than 20 simulations or draws, non-finite values.
    """
    s, t = check_samples_and_theta(samples, theta)
    names = check_parameter_names(parameter_names, t.shape[1])
    u = (count_below(s, t) + 0.5) / (s.shape[0] + 1)
    return CoverageCurve(np.abs(2.0 * u - 1.0), s.shape[0], "central", names)
