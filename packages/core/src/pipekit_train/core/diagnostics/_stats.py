"""The few distribution functions the diagnostics need, in numpy (no scipy in core).

- `chi2_sf`: the chi-squared survival function, through the regularised upper incomplete
  gamma function `Q(k/2, x/2)` (series below `a + 1`, a continued fraction above, the
  classical pair of expansions; accurate to ~1e-12 for the degrees of freedom a rank
  histogram has).
- `kolmogorov_sf`: the one-sample Kolmogorov–Smirnov p-value for `n` points at distance
  `d`, from the limiting Kolmogorov distribution with Stephens' (1970) small-sample
  correction `λ = (√n + 0.12 + 0.11/√n) d` (within ~0.01 of the exact value for n ≥ 20).
- `binomial_cdf_table`: `P(K ≤ k)` for `K ~ Binomial(n, p)` at several `p`, every `k`.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["binomial_cdf_table", "chi2_sf", "kolmogorov_sf"]

_EPS = 1e-15
_TINY = 1e-300


def _gamma_q(a: float, x: float) -> float:
    """The regularised upper incomplete gamma function `Q(a, x) = Γ(a, x) / Γ(a)`."""
    if x <= 0.0:
        return 1.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1.0:  # the series for P(a, x) converges fast here
        term = total = 1.0 / a
        n = a
        for _ in range(10_000):
            n += 1.0
            term *= x / n
            total += term
            if abs(term) < abs(total) * _EPS:
                break
        return max(0.0, 1.0 - total * math.exp(log_front))
    # the continued fraction for Q(a, x) (modified Lentz)
    b = x + 1.0 - a
    c = 1.0 / _TINY
    d = 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = _TINY if abs(d) < _TINY else d
        c = b + an / c
        c = _TINY if abs(c) < _TINY else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            break
    return min(1.0, math.exp(log_front) * h)


def chi2_sf(statistic: float, dof: int) -> float:
    """`P(X ≥ statistic)` for `X ~ χ²(dof)`."""
    return _gamma_q(dof / 2.0, statistic / 2.0)


def kolmogorov_sf(distance: float, n: int) -> float:
    """The p-value of a one-sample KS distance `distance` from `n` points (see module doc)."""
    root = math.sqrt(n)
    lam = (root + 0.12 + 0.11 / root) * distance
    if lam < 0.2:
        return 1.0
    total = 0.0
    for k in range(1, 101):
        term = 2.0 * (-1) ** (k - 1) * math.exp(-2.0 * k * k * lam * lam)
        total += term
        if abs(term) < 1e-16:
            break
    return min(1.0, max(0.0, total))


def binomial_cdf_table(n: int, p: np.ndarray) -> np.ndarray:
    """`table[i, k] = P(K ≤ k)` for `K ~ Binomial(n, p[i])`, `k = 0..n`.

    Args:
        n: the number of trials.
        p: success probabilities strictly inside (0, 1), shape `(m,)`.

    Returns:
        `(m, n + 1)` float64, non-decreasing along `k`, ending at 1.
    """
    k = np.arange(n + 1, dtype=np.float64)
    log_fact = np.array([math.lgamma(i + 1.0) for i in range(n + 1)])
    log_choose = log_fact[n] - log_fact - log_fact[::-1]
    p = np.asarray(p, dtype=np.float64)[:, None]
    log_pmf = log_choose + k * np.log(p) + (n - k) * np.log1p(-p)
    cdf = np.cumsum(np.exp(log_pmf), axis=1)
    return np.minimum(cdf / cdf[:, -1:], 1.0)
