"""Simulation-based calibration (Talts, Betancourt, Simpson, Vehtari, Gelman 2018).

Draw `θ_i` from the prior, simulate `x_i`, draw `S` samples from the posterior at `x_i`
and count how many fall below `θ_i`, parameter by parameter: `sbc_ranks`. A calibrated
posterior makes every parameter's ranks uniform on `0..S`; `check_sbc` tests that with a
chi-squared and a KS test and the ECDF difference with its simultaneous band (see
`_ranks`). Shapes: samples first, `samples (S, N, D)`, `theta (N, D)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipekit_train.core._checks import check_seed, positive_int
from pipekit_train.core._errors import ConfigError

from ._inputs import (
    check_parameter_names,
    check_probability,
    check_ranks,
    check_samples_and_theta,
)
from ._ranks import (
    chi2_uniformity,
    count_below,
    default_bins,
    ecdf_band,
    ecdf_difference,
    ecdf_points,
    ks_uniformity,
)

__all__ = ["SBCCheck", "check_sbc", "sbc_ranks"]


def sbc_ranks(samples: Any, theta: Any) -> np.ndarray:
    """The SBC rank of each true parameter among its posterior draws.

    Args:
        samples: posterior draws `(S, N, D)`: `samples[:, i]` from the posterior at the
            observation simulated from `theta[i]` (`(S, N)` for one parameter).
        theta: the true parameters `(N, D)` (or `(N,)`), drawn from the prior.

    Returns:
        int64 ranks `(N, D)` in `0..S`: how many draws are below the truth.

    Raises:
        ConfigError: mismatched shapes, fewer than 20 simulations or draws, non-finite values.
    """
    s, t = check_samples_and_theta(samples, theta)
    return count_below(s, t)


@dataclass(frozen=True, eq=False)
class SBCCheck:
    """What `check_sbc` found, per parameter (arrays are indexed by parameter last).

    Attributes:
        ranks: the ranks `(N, D)`.
        num_samples: `S`, the posterior draws each rank counts among.
        parameter_names: one name per parameter.
        alpha: the tests' level.
        bins: the chi-squared test's number of bins.
        chi2_statistic: `(D,)`.
        chi2_pvalue: `(D,)`: small when the rank histogram is not flat.
        ks_statistic: `(D,)`: the largest gap between the ranks' ECDF and the uniform CDF.
        ks_pvalue: `(D,)` (conservative for discrete ranks).
        points: the fractional ranks `z` `(K,)` the ECDF is read at.
        ecdf_difference: `ECDF(z) - z`, `(K, D)`.
        band_lower: the simultaneous band's lower edge `(K,)` (ECDF-difference units).
        band_upper: its upper edge `(K,)`.
        inside_band: `(D,)` bool: the parameter's ECDF difference stays inside the band.
    """

    ranks: np.ndarray
    num_samples: int
    parameter_names: tuple[str, ...]
    alpha: float
    bins: int
    chi2_statistic: np.ndarray
    chi2_pvalue: np.ndarray
    ks_statistic: np.ndarray
    ks_pvalue: np.ndarray
    points: np.ndarray
    ecdf_difference: np.ndarray
    band_lower: np.ndarray
    band_upper: np.ndarray
    inside_band: np.ndarray

    @property
    def passed(self) -> bool:
        """Whether every parameter's ECDF difference stays inside its `1 - alpha` band.

        The band is simultaneous over the points of one parameter; with several
        parameters, each is tested at level `alpha` (no correction for their number).
        """
        return bool(np.all(self.inside_band))

    def metrics(self, prefix: str = "sbc") -> dict[str, float]:
        """Scalars for a metric writer: the smallest p-values and the share inside the band."""
        return {
            f"{prefix}_chi2_pvalue_min": float(np.min(self.chi2_pvalue)),
            f"{prefix}_ks_pvalue_min": float(np.min(self.ks_pvalue)),
            f"{prefix}_inside_band": float(np.mean(self.inside_band)),
        }

    def figure(self, *, title: str | None = None) -> Any:
        """The ECDF-difference plot with its band, one panel per parameter (a matplotlib
        `Figure`; needs the `[plot]` extra)."""
        from ._plots import sbc_figure

        return sbc_figure(self, title=title)

    def plot(self, path: Any, *, title: str | None = None) -> str:
        """Draw `figure()` to a PNG at `path` and return the path."""
        from ._plots import save_png

        return save_png(self.figure(title=title), path)


def check_sbc(
    ranks: Any,
    num_samples: int,
    *,
    alpha: float = 0.05,
    bins: int | None = None,
    parameter_names: Sequence[str] | None = None,
    seed: int = 0,
    num_band_simulations: int = 1000,
    max_points: int = 100,
) -> SBCCheck:
    """Test SBC ranks for uniformity, parameter by parameter.

    Args:
        ranks: int ranks `(N, D)` (or `(N,)`) in `0..num_samples`, e.g. from `sbc_ranks`.
        num_samples: `S`, the number of posterior draws each rank was counted among.
        alpha: the level of the tests and of the band (0.05: a 95% band).
        bins: bins of the chi-squared test (default: about 5 ranks per bin, at most 20).
        parameter_names: names for plots and reports (default `theta_0`, `theta_1`, …).
        seed: seeds the simulation of the band (the result is a function of it).
        num_band_simulations: sets of uniform draws the band's level is tuned on.
        max_points: the most points the ECDF is read at.

    Returns:
        An `SBCCheck`.

    Raises:
        ConfigError: ranks outside `0..num_samples`, fewer than 20 simulations, a bad
            `alpha`, `bins` or seed.
    """
    r, s = check_ranks(ranks, num_samples)
    alpha = check_probability("alpha", alpha)
    seed = check_seed(seed)
    num_band_simulations = positive_int("num_band_simulations", num_band_simulations)
    max_points = positive_int("max_points", max_points)
    n, d = r.shape
    names = check_parameter_names(parameter_names, d)
    if bins is None:
        bins = default_bins(n, s)
    else:
        bins = positive_int("bins", bins)
        if not 2 <= bins <= s + 1:
            raise ConfigError(
                f"`bins` must be in 2..num_samples + 1. Received: bins={bins} with num_samples={s}."
            )
    chi2 = np.array([chi2_uniformity(r[:, j], s, bins) for j in range(d)])
    ks = np.array([ks_uniformity(r[:, j], s) for j in range(d)])
    cuts = ecdf_points(s, max_points)
    points = cuts / (s + 1)
    diff = np.stack([ecdf_difference(r[:, j], s, cuts) for j in range(d)], axis=1)
    lower, upper = ecdf_band(
        n, points, alpha=alpha, seed=seed, num_band_simulations=num_band_simulations
    )
    tol = 0.5 / n  # the ECDF moves in steps of 1/N: compare counts, not floats
    inside = np.all((diff >= lower[:, None] - tol) & (diff <= upper[:, None] + tol), axis=0)
    return SBCCheck(
        ranks=r,
        num_samples=s,
        parameter_names=names,
        alpha=alpha,
        bins=bins,
        chi2_statistic=chi2[:, 0],
        chi2_pvalue=chi2[:, 1],
        ks_statistic=ks[:, 0],
        ks_pvalue=ks[:, 1],
        points=points,
        ecdf_difference=diff,
        band_lower=lower,
        band_upper=upper,
        inside_band=inside,
    )
