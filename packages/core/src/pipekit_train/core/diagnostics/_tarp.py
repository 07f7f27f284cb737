"""TARP: tests of accuracy with random points (Lemos, Coogan, Hezaveh, Perreault-Levasseur 2023).

For each simulation `i` draw a reference point `θ_ref,i` independently of the truth, and
count the fraction `f_i` of posterior draws closer to the reference than the truth is
(Euclidean distance, after dividing each parameter by its standard deviation over the
true parameters when `normalize=True`). The *expected coverage probability* is
`ECP(α) = mean_i [f_i < α]` (here with the rank form `f_i = (r_i + 1/2) / (S + 1)`); it
is the diagonal `ECP(α) = α` for every `α` if and only if the posterior is exactly right
(Lemos et al., their theorem: a necessary and sufficient condition, unlike the coverage
of one family of regions).

Summaries:

- `atc`, the area to the curve: `∫_{1/2}^{1} (ECP(α) - α) dα` (trapezoids on the level
  grid): 0 when calibrated, negative for an over-confident posterior (the truth is often
  farther than nearly every draw, so `f_i` piles up near 0 and 1 and the curve falls
  below the diagonal above 1/2), positive for an under-confident one. sbi's `check_tarp`
  sums the same differences over its grid instead (its value is this one divided by the
  grid step).
- `ks_statistic` / `ks_pvalue`: a one-sample KS test of the ranks `r_i` against the
  uniform on `0..S` (the `f_i` are uniform when the posterior is calibrated).

Reference points: by default uniform in the box spanned by the (normalised) true
parameters, drawn with `seed`, as sbi does; pass `references` to choose them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pipekit_train.core._checks import check_seed
from pipekit_train.core._errors import ConfigError

from ._inputs import check_samples_and_theta
from ._ranks import count_below, ks_uniformity

__all__ = ["TARPResult", "tarp"]


@dataclass(frozen=True, eq=False)
class TARPResult:
    """The TARP curve and its summaries (see `tarp`).

    Attributes:
        alpha: the credibility levels `(L,)`, 0 … 1.
        ecp: the expected coverage probability at each level `(L,)`.
        atc: the area between the curve and the diagonal above 1/2 (0 when calibrated,
            < 0 over-confident, > 0 under-confident).
        ks_statistic: the KS distance of the ranks to the uniform.
        ks_pvalue: its p-value (small: not calibrated).
        credibility: per simulation, `f_i` `(N,)`.
        num_samples: `S`, the posterior draws per simulation.
    """

    alpha: np.ndarray
    ecp: np.ndarray
    atc: float
    ks_statistic: float
    ks_pvalue: float
    credibility: np.ndarray
    num_samples: int

    def passed(self, alpha: float = 0.05) -> bool:
        """Whether the KS test keeps calibration at level `alpha`."""
        return bool(self.ks_pvalue >= alpha)

    def metrics(self, prefix: str = "tarp") -> dict[str, float]:
        """Scalars for a metric writer: `tarp_atc`, `tarp_ks_pvalue`."""
        return {f"{prefix}_atc": self.atc, f"{prefix}_ks_pvalue": self.ks_pvalue}

    def figure(self, *, title: str | None = None) -> Any:
        """The ECP curve against the diagonal (a matplotlib `Figure`; `[plot]` extra)."""
        from ._plots import tarp_figure

        return tarp_figure(self, title=title)

    def plot(self, path: Any, *, title: str | None = None) -> str:
        """Draw `figure()` to a PNG at `path` and return the path."""
        from ._plots import save_png

        return save_png(self.figure(title=title), path)


def tarp(
    samples: Any,
    theta: Any,
    *,
    references: Any = None,
    normalize: bool = True,
    seed: int = 0,
    num_levels: int = 101,
) -> TARPResult:
    """TARP's expected coverage probability curve and its summaries.

    Args:
        samples: posterior draws `(S, N, D)`, samples first (`(S, N)` for one parameter).
        theta: the true parameters `(N, D)` (or `(N,)`).
        references: reference points `(N, D)`, one per simulation (default: uniform in
            the box of the true parameters, drawn with `seed`).
        normalize: divide each parameter by its standard deviation over `theta` (and
            centre it) before measuring distances, so that no parameter's units dominate.
        seed: seeds the reference points.
        num_levels: the number of levels `α` on 0 … 1 the curve is read at.

    Returns:
        A `TARPResult`.

    Raises:
        ConfigError: mismatched shapes (of `references` too), fewer than 20 simulations
            or draws, non-finite values, `num_levels < 3`.
    """
    s, t = check_samples_and_theta(samples, theta)
    seed = check_seed(seed)
    if isinstance(num_levels, bool) or not isinstance(num_levels, int) or num_levels < 3:
        raise ConfigError(f"`num_levels` must be an int >= 3. Received: num_levels={num_levels!r}.")
    if references is None:
        ref = None
    else:
        ref = np.asarray(references, dtype=np.float64)
        if ref.ndim == 1 and t.shape[1] == 1:
            ref = ref[:, None]
        if ref.shape != t.shape or not np.all(np.isfinite(ref)):
            raise ConfigError(
                "`references` must be finite points (num_simulations, num_parameters), like "
                f"theta. Received: references.shape={ref.shape}, theta.shape={t.shape}."
            )
    if normalize:
        centre = t.mean(axis=0)
        scale = t.std(axis=0)
        scale = np.where(scale > 0, scale, 1.0)
        s, t = (s - centre) / scale, (t - centre) / scale
        if ref is not None:
            ref = (ref - centre) / scale
    if ref is None:
        rng = np.random.default_rng(seed)
        ref = rng.uniform(t.min(axis=0), t.max(axis=0), size=t.shape)
    d_samples = np.sqrt(np.sum((s - ref[None]) ** 2, axis=-1))  # (S, N)
    d_theta = np.sqrt(np.sum((t - ref) ** 2, axis=-1))  # (N,)
    ranks = count_below(d_samples, d_theta)
    num_samples = s.shape[0]
    cred = (ranks + 0.5) / (num_samples + 1)
    alpha = np.linspace(0.0, 1.0, num_levels)
    ecp = np.mean(cred[None, :] < alpha[:, None], axis=1)
    upper = alpha >= 0.5
    gap = ecp[upper] - alpha[upper]
    atc = float(np.sum((gap[1:] + gap[:-1]) / 2.0 * np.diff(alpha[upper])))
    ks, pvalue = ks_uniformity(ranks, num_samples)
    return TARPResult(
        alpha=alpha,
        ecp=ecp,
        atc=atc,
        ks_statistic=ks,
        ks_pvalue=pvalue,
        credibility=cred,
        num_samples=num_samples,
    )
