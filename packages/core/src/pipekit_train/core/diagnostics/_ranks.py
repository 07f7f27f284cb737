"""Ranks and their uniformity: the statistics SBC, coverage and TARP share.

Each diagnostic reduces one simulation to a *rank*: the number `r` of the `S` posterior
draws that fall below the truth in some statistic (a parameter's value for SBC, minus the
log-density for highest-density coverage, the distance to a reference point for TARP).
When the posterior is calibrated, the truth is one more draw from it, so `r` is uniform on
`0..S` (Talts et al. 2018). Everything here tests that uniformity:

- `chi2_uniformity`: Pearson's chi-squared on `B` bins of the ranks, with the exact
  expected share of each bin (`B` need not divide `S + 1`), `B - 1` degrees of freedom.
- `ks_uniformity`: the largest gap between the ranks' ECDF and the discrete uniform CDF,
  with the Kolmogorov p-value (conservative for discrete ranks: a calibrated posterior is
  rejected less often than `alpha`).
- `ecdf_difference` and `ecdf_band`: the ECDF of the fractional ranks minus the uniform
  CDF, at the points `z_j = j / (S + 1)` (where a calibrated rank's CDF is exactly `z_j`),
  and the simultaneous `1 - alpha` band of Säilynoja, Bürkner and Vehtari (2022), found by
  simulation: pointwise binomial intervals whose level `γ` is tuned on
  `num_band_simulations` sets of `N` uniform draws so that a fraction `1 - alpha` of them
  stays inside at every point at once.
"""

from __future__ import annotations

import numpy as np

from ._stats import binomial_cdf_table, chi2_sf, kolmogorov_sf

__all__ = [
    "chi2_uniformity",
    "count_below",
    "default_bins",
    "ecdf_band",
    "ecdf_difference",
    "ecdf_points",
    "ks_uniformity",
]


def count_below(draws: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """`#{s: draws[s, ...] < truth[...]}`: the rank of the truth among the draws."""
    return np.sum(draws < truth[None], axis=0).astype(np.int64)


def default_bins(num_simulations: int, num_samples: int) -> int:
    """Bins for the chi-squared test: about 5 expected ranks per bin, at most 20."""
    return int(max(2, min(20, num_simulations // 5, num_samples + 1)))


def chi2_uniformity(ranks: np.ndarray, num_samples: int, bins: int) -> tuple[float, float]:
    """Pearson's chi-squared statistic and p-value of ranks `(N,)` in `0..num_samples`."""
    size = num_samples + 1
    bin_of_rank = np.arange(size) * bins // size
    expected_share = np.bincount(bin_of_rank, minlength=bins) / size
    observed = np.bincount(ranks * bins // size, minlength=bins)
    expected = expected_share * len(ranks)
    statistic = float(np.sum((observed - expected) ** 2 / expected))
    return statistic, chi2_sf(statistic, bins - 1)


def ks_uniformity(ranks: np.ndarray, num_samples: int) -> tuple[float, float]:
    """The KS distance of ranks `(N,)` to the discrete uniform on `0..num_samples`, and p."""
    size = num_samples + 1
    ecdf = np.cumsum(np.bincount(ranks, minlength=size)) / len(ranks)
    uniform = np.arange(1, size + 1) / size
    distance = float(np.max(np.abs(ecdf - uniform)))
    return distance, kolmogorov_sf(distance, len(ranks))


def ecdf_points(num_samples: int, max_points: int = 100) -> np.ndarray:
    """The integer cut points `j` (in `1..num_samples`) the ECDF is read at."""
    count = min(num_samples, max_points)
    return np.unique(np.round(np.linspace(1, num_samples, count)).astype(np.int64))


def ecdf_difference(ranks: np.ndarray, num_samples: int, cuts: np.ndarray) -> np.ndarray:
    """`P̂(r < j) - j / (S + 1)` at each cut `j`: shape `(K,)` for ranks `(N,)`."""
    below = np.mean(ranks[:, None] < cuts[None, :], axis=0)
    return below - cuts / (num_samples + 1)


def _pointwise_pvalues(table: np.ndarray) -> np.ndarray:
    """Two-sided binomial p-value of every count: `2 min(P(K ≤ c), P(K ≥ c))`, capped at 1."""
    below_or_at = table
    strictly_below = np.concatenate([np.zeros((len(table), 1)), table[:, :-1]], axis=1)
    return np.minimum(1.0, 2.0 * np.minimum(below_or_at, 1.0 - strictly_below))


def ecdf_band(
    num_simulations: int,
    points: np.ndarray,
    *,
    alpha: float,
    seed: int,
    num_band_simulations: int = 1000,
) -> tuple[np.ndarray, np.ndarray]:
    """The simultaneous `1 - alpha` band of the ECDF difference at `points` in (0, 1).

    Returns:
        `(lower, upper)`, each `(K,)`, in ECDF-difference units (`count / N - z`): a
        calibrated ECDF difference stays inside at every point with probability
        `1 - alpha`.
    """
    n, z = int(num_simulations), np.asarray(points, dtype=np.float64)
    pvalues = _pointwise_pvalues(binomial_cdf_table(n, z))  # (K, N + 1)
    rng = np.random.default_rng(seed)
    draws = np.sort(rng.random((num_band_simulations, n)), axis=1)
    offset = 2.0 * np.arange(num_band_simulations)[:, None]
    counts = np.searchsorted((draws + offset).ravel(), z[None, :] + offset)
    counts = counts - n * np.arange(num_band_simulations)[:, None]  # (M, K): #draws < z
    worst = np.min(pvalues[np.arange(len(z))[None, :], counts], axis=1)  # (M,)
    gamma = float(np.quantile(worst, alpha, method="lower"))
    inside = pvalues >= gamma
    first = np.argmax(inside, axis=1)
    last = n - np.argmax(inside[:, ::-1], axis=1)
    return first / n - z, last / n - z
