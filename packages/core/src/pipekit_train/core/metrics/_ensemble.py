"""Scores of an ensemble forecast: CRPS, spread–skill, rank histograms, per lead time.

Host metrics in numpy (no array API): an ensemble of `M` members is an array with a
member axis (`member_axis`) and the truth the same array without it.

- `crps_ensemble`: the continuous ranked probability score of the ensemble's empirical
  distribution per element, fair (unbiased for the CRPS of the distribution the members
  are drawn from) or standard, in the sorted `O(M log M)` form.
- `crps_gaussian`: the closed-form CRPS of a normal distribution.
- `spread_skill`: the RMSE of the ensemble mean, the spread (the root of the mean
  unbiased variance over the members) and their ratio with the finite-ensemble factor
  `sqrt((M + 1) / M)`, about 1 for a calibrated ensemble.
- `ensemble_ranks`, `rank_histogram`, `rank_flatness`: the truth's rank among the
  members (ties broken at random), its histogram over the `M + 1` ranks, and how far
  that histogram is from flat.
- `ensemble_lead_metrics`: all of them per lead time (and channel) for rollouts
  `(n, H, M, *state)`, in the layout `rollout_errors` returns, so `summarize` names them
  (`val_rollout_crps_lead_1_10`, ...).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pipekit_train.core._checks import check_seed, is_int
from pipekit_train.core._errors import ConfigError

__all__ = [
    "crps_ensemble",
    "crps_gaussian",
    "ensemble_lead_metrics",
    "ensemble_ranks",
    "rank_flatness",
    "rank_histogram",
    "spread_skill",
]

_erf = np.frompyfunc(math.erf, 1, 1)


def _members_first(
    ensemble: Any, truth: Any, member_axis: Any, *, min_members: int, why: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """The ensemble with its member axis first and the truth, both float64, checked."""
    ens = np.asarray(ensemble, dtype=np.float64)
    y = np.asarray(truth, dtype=np.float64)
    if not is_int(member_axis) or not -ens.ndim <= member_axis < max(ens.ndim, 1):
        raise ConfigError(
            f"`member_axis` must be an axis of `ensemble` (shape {ens.shape}). Received: "
            f"member_axis={member_axis!r}. Pass the axis that holds the members."
        )
    ens = np.moveaxis(ens, int(member_axis), 0)
    if ens.shape[1:] != y.shape:
        raise ConfigError(
            "`truth` must have the ensemble's shape without its member axis. Received: "
            f"ensemble shape {np.asarray(ensemble).shape} (members on axis {member_axis}), "
            f"truth shape {y.shape}, expected {ens.shape[1:]}."
        )
    if ens.shape[0] < min_members:
        raise ConfigError(
            f"{why or 'This score'} needs at least {min_members} ensemble members. Received: "
            f"{ens.shape[0]} member(s) (axis {member_axis} of shape "
            f"{np.asarray(ensemble).shape}). Roll out more members."
        )
    return ens, y


def crps_ensemble(ensemble: Any, truth: Any, *, member_axis: int = 0, fair: bool = True) -> Any:
    """The CRPS of an ensemble per element, fair (default) or standard.

    With members `x_1..x_M` and truth `y`,
    `CRPS = (1/M) Σ_i |x_i - y| - c Σ_i Σ_j |x_i - x_j|` with `c = 1 / (2 M (M - 1))`
    (fair: its expectation over ensembles drawn from a distribution `F` is the CRPS of
    `F`, whatever `M`; Ferro 2014) or `c = 1 / (2 M²)` (standard: the CRPS of the
    members' empirical distribution, larger by `E|X - X'| / (2M)` in expectation). The
    pairwise sum is computed from the sorted members, `Σ_i Σ_j |x_i - x_j| =
    2 Σ_k (2k - M - 1) x_(k)`, in `O(M log M)` per element. The score has the truth's
    units; lower is better; NaN members give NaN.

    Args:
        ensemble: the members, on `member_axis`.
        truth: the true values: the ensemble's shape without the member axis.
        member_axis: the axis of `ensemble` that holds the members.
        fair: the fair (unbiased) score; needs `M >= 2`. False: the standard one.

    Returns:
        The score per element, the truth's shape (a float for a scalar truth).

    Raises:
        ConfigError: shapes that do not match, a bad `member_axis`, or `fair=True` with
            one member.

    Examples:
        >>> import numpy as np
        >>> from pipekit_train.core.metrics import crps_ensemble
        >>> crps_ensemble(np.array([0.0, 1.0]), 0.0, fair=False)  # 0.5 - 1 / 4
        0.25
        >>> crps_ensemble(np.array([0.0, 1.0]), 0.0)  # 0.5 - 1 / 2
        0.0
    """
    if not isinstance(fair, bool):
        raise ConfigError(f"`fair` must be True or False. Received: fair={fair!r}.")
    ens, y = _members_first(
        ensemble,
        truth,
        member_axis,
        min_members=2 if fair else 1,
        why="The fair CRPS (fair=True)" if fair else "",
    )
    m = ens.shape[0]
    skill = np.mean(np.abs(ens - y[None]), axis=0)
    ranks = np.arange(1, m + 1, dtype=np.float64).reshape((m,) + (1,) * y.ndim)
    pairs = 2.0 * np.sum((2.0 * ranks - m - 1.0) * np.sort(ens, axis=0), axis=0)
    out = skill - pairs / (2.0 * m * (m - 1 if fair else m))
    return float(out) if out.ndim == 0 else out


def crps_gaussian(mean: Any, std: Any, truth: Any) -> Any:
    """The CRPS of a normal distribution `N(mean, std²)` at `truth`, in closed form.

    `CRPS = σ [z (2Φ(z) - 1) + 2φ(z) - 1/√π]` with `z = (y - μ) / σ` (Gneiting and
    Raftery 2007); `|y - μ|` where `σ = 0`. `Φ` is computed with `math.erf` (no scipy).

    Args:
        mean: the means; broadcast against `std` and `truth`.
        std: the standard deviations (non-negative).
        truth: the true values.

    Returns:
        The score per element of the broadcast shape (a float for scalars).

    Raises:
        ConfigError: a negative or NaN standard deviation.

    Examples:
        >>> from pipekit_train.core.metrics import crps_gaussian
        >>> round(crps_gaussian(0.0, 1.0, 0.0), 6)  # (√2 - 1) / √π
        0.233695
    """
    mu, sigma, y = np.broadcast_arrays(
        np.asarray(mean, dtype=np.float64),
        np.asarray(std, dtype=np.float64),
        np.asarray(truth, dtype=np.float64),
    )
    if not np.all(sigma >= 0):
        raise ConfigError(
            "`std` must be non-negative standard deviations. Received: std with minimum "
            f"{np.nanmin(sigma) if np.any(np.isfinite(sigma)) else np.nan} "
            f"({int(np.sum(~(sigma >= 0)))} negative or NaN). Pass std = sqrt(variance)."
        )
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(sigma > 0, (y - mu) / np.where(sigma > 0, sigma, 1.0), 0.0)
    cdf = 0.5 * (1.0 + np.asarray(_erf(z / math.sqrt(2.0)), dtype=np.float64))
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    out = sigma * (z * (2.0 * cdf - 1.0) + 2.0 * pdf - 1.0 / math.sqrt(math.pi))
    out = np.where(sigma > 0, out, np.abs(y - mu))
    return float(out) if out.ndim == 0 else out


def spread_skill(
    ensemble: Any,
    truth: Any,
    *,
    member_axis: int = 0,
    axis: int | tuple[int, ...] | None = None,
) -> dict[str, Any]:
    """The ensemble mean's RMSE, the ensemble's spread and the spread–skill ratio.

    - `rmse = sqrt(mean((x̄ - y)²))`, `x̄` the mean over the members;
    - `spread = sqrt(mean(s²))`, `s²` the unbiased variance over the members (`ddof=1`);
    - `ratio = sqrt((M + 1) / M) * spread / rmse`.

    The means run over `axis` of the truth (None: every element). For a calibrated
    ensemble (the truth one more draw from the members' distribution) the expected
    squared error of the mean is `(1 + 1/M)` times the expected variance, so the factor
    makes `ratio ≈ 1` for any `M`; below 1 the ensemble is under-dispersive
    (overconfident), above 1 over-dispersive (Fortin et al. 2014).

    Args:
        ensemble: the members, on `member_axis` (at least 2).
        truth: the true values: the ensemble's shape without the member axis.
        member_axis: the axis of `ensemble` that holds the members.
        axis: the axes of `truth` averaged over (None: all).

    Returns:
        `{"rmse", "spread", "ratio"}`, floats, or arrays of the axes not averaged over.
        `ratio` is `inf` where `rmse` is 0 and the spread is not, NaN where both are.

    Raises:
        ConfigError: shapes that do not match, fewer than 2 members.

    Examples:
        >>> import numpy as np
        >>> from pipekit_train.core.metrics import spread_skill
        >>> scores = spread_skill(np.array([[0.0], [2.0]]), np.array([2.0]))
        >>> scores["rmse"], scores["spread"], round(scores["ratio"], 4)
        (1.0, 1.4142135623730951, 1.7321)
    """
    ens, y = _members_first(
        ensemble, truth, member_axis, min_members=2, why="The spread (an unbiased variance)"
    )
    m = ens.shape[0]
    err2 = (ens.mean(axis=0) - y) ** 2
    var = ens.var(axis=0, ddof=1)
    rmse = np.sqrt(np.mean(err2, axis=axis))
    spread = np.sqrt(np.mean(var, axis=axis))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = math.sqrt((m + 1) / m) * spread / rmse
    out = {"rmse": rmse, "spread": spread, "ratio": ratio}
    return {k: float(v) if np.ndim(v) == 0 else np.asarray(v) for k, v in out.items()}


def ensemble_ranks(ensemble: Any, truth: Any, *, member_axis: int = 0, seed: int = 0) -> Any:
    """The rank of the truth among the members per element, `0..M`, ties broken at random.

    The rank is the number of members below the truth plus, when `t` members equal it, a
    uniform integer in `0..t` (the randomised rule of Hamill 2001), drawn from
    `numpy.random.default_rng(seed)`: the same inputs and seed give the same ranks.

    Args:
        ensemble: the members, on `member_axis`.
        truth: the true values: the ensemble's shape without the member axis.
        member_axis: the axis of `ensemble` that holds the members.
        seed: the seed of the tie-breaking draws (a non-negative int).

    Returns:
        int64 ranks of the truth's shape.

    Raises:
        ConfigError: shapes that do not match, a bad seed, or non-finite values (a NaN has
            no rank).
    """
    seed = check_seed(seed)
    ens, y = _members_first(ensemble, truth, member_axis, min_members=1)
    if not (np.isfinite(ens).all() and np.isfinite(y).all()):
        raise ConfigError(
            "Ranks need finite members and truth. Received: "
            f"{int(np.sum(~np.isfinite(ens)))} non-finite member values and "
            f"{int(np.sum(~np.isfinite(y)))} non-finite truth values. Drop the diverged "
            "elements first."
        )
    below = np.sum(ens < y[None], axis=0)
    ties = np.sum(ens == y[None], axis=0)
    rng = np.random.default_rng(seed)
    return (below + rng.integers(0, ties + 1)).astype(np.int64)


def rank_histogram(ensemble: Any, truth: Any, *, member_axis: int = 0, seed: int = 0) -> Any:
    """How often the truth takes each rank `0..M` among the `M` members: `(M + 1,)` counts.

    Over every element (`ensemble_ranks`, ties broken at random with `seed`). A
    calibrated ensemble gives a flat histogram, an under-dispersive one a U shape (the
    truth often outside the members), an over-dispersive one a dome, a biased one a
    slope.

    Examples:
        >>> import numpy as np
        >>> from pipekit_train.core.metrics import rank_histogram
        >>> rank_histogram(np.array([[0.0, 0.0], [1.0, 1.0]]), np.array([2.0, 0.5]))
        array([0, 1, 1])
    """
    ranks = ensemble_ranks(ensemble, truth, member_axis=member_axis, seed=seed)
    m = np.asarray(ensemble).shape[member_axis]
    return np.bincount(np.ravel(ranks), minlength=m + 1)


def rank_flatness(counts: Any, axis: int = -1) -> Any:
    """How far rank histograms are from flat: Pearson's chi-squared over its degrees of freedom.

    For counts `c_k` over `K = M + 1` bins, `N = Σ c_k`, `e = N / K`:
    `flatness = Σ (c_k - e)² / e / (K - 1)`, the normalised statistic of Candille and
    Talagrand (2005) (`δ`). When the `N` ranks are independent draws from the uniform
    distribution its expectation is 1 (the chi-squared's degrees of freedom divided
    out); a U shape, a dome or a slope makes it larger, and it grows with `N` for a
    fixed shape. Ranks of neighbouring grid points or variables are correlated, which
    raises it even for a calibrated ensemble: compare it across validations of the same
    data rather than against 1. NaN for an empty histogram.

    Args:
        counts: histograms, the bins on `axis` (e.g. `rank_histogram`'s `(M + 1,)`).
        axis: the bin axis.

    Returns:
        A float, or an array of the other axes.

    Examples:
        >>> import numpy as np
        >>> from pipekit_train.core.metrics import rank_flatness
        >>> rank_flatness(np.array([10, 10, 10])), rank_flatness(np.array([20, 0, 10]))
        (0.0, 10.0)
    """
    c = np.moveaxis(np.asarray(counts, dtype=np.float64), axis, -1)
    if c.ndim < 1 or c.shape[-1] < 2 or np.any(c < 0):
        raise ConfigError(
            "`counts` must be non-negative histograms of at least 2 bins on `axis`. "
            f"Received: counts with shape {np.shape(counts)}, axis={axis}."
        )
    k = c.shape[-1]
    n = c.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = n / k
        out = np.sum((c - expected) ** 2 / expected, axis=-1) / (k - 1)
    return float(out) if out.ndim == 0 else out


def ensemble_lead_metrics(
    ensemble: Any,
    truth: Any,
    *,
    member_axis: int = 2,
    per_channel: bool = False,
    fair: bool = True,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Ensemble scores per lead time (and channel) of rolled-out ensembles.

    The layout is `rollout_errors`' with a member axis: ensembles `(n, H, M, *state)`
    (`n` starts, `H` leads, lead 1 first, `M` members) against the truth `(n, H,
    *state)`. Each score is averaged over the starts and the state's elements (per
    channel, the last axis, with `per_channel=True`):

    - `"crps"`: the mean CRPS (`crps_ensemble`, fair unless `fair=False`), `(H, C)`;
    - `"spread"`, `"ens_rmse"`, `"spread_skill"`: `spread_skill`'s spread, RMSE of the
      ensemble mean and ratio, `(H, C)`;
    - `"rank_histogram"`: the truth's ranks at each lead over every start and element,
      `(H, M + 1)` counts (ties broken at random with `seed`);
    - `"rank_flatness"`: `rank_flatness` of each lead's histogram, `(H, 1)`.

    `C` is 1 without `per_channel`. A lead where any member or truth value is NaN or
    infinite (a diverged rollout) scores `inf` (its histogram row is zeros). Pass the
    dict less `"rank_histogram"` to `summarize` (channels for the `(H, C)` scores) for
    named scalars such as `"val_rollout_crps_lead_1_10"`; a window's value is the mean
    of its leads' values.

    Args:
        ensemble: the rolled-out members `(n, H, M, *state)` (members on `member_axis`).
        truth: the true states at the same leads, `(n, H, *state)`.
        member_axis: the axis of `ensemble` that holds the members.
        per_channel: scores per channel (the last axis) rather than pooled.
        fair: the fair CRPS (default) or the standard one.
        seed: the seed of the rank ties' draws.

    Returns:
        `{name: array}` as above.

    Raises:
        ConfigError: fewer than 2 members, shapes that do not match, a truth without a
            lead axis, or a bad seed.
    """
    seed = check_seed(seed)
    if not isinstance(per_channel, bool):
        raise ConfigError(
            f"`per_channel` must be True or False. Received: per_channel={per_channel!r}."
        )
    ens, y = _members_first(ensemble, truth, member_axis, min_members=2, why="Ensemble scores")
    if y.ndim < 3:
        raise ConfigError(
            "`truth` must be rollouts (n_starts, horizon, *state_shape) and `ensemble` "
            f"(n_starts, horizon, members, *state_shape). Received: truth.shape={y.shape}. "
            "Stack the rollouts, starts first."
        )
    m, horizon = ens.shape[0], y.shape[1]
    # leads first: ens (H, M, n, *state), y (H, n, *state)
    ens = np.moveaxis(ens, (0, 2), (1, 0))
    y = np.moveaxis(y, 1, 0)
    finite = np.isfinite(ens).reshape(horizon, -1).all(axis=1) & np.isfinite(y).reshape(
        horizon, -1
    ).all(axis=1)
    keep = finite.reshape((horizon,) + (1,) * (ens.ndim - 1))
    ens = np.where(keep, ens, 0.0)
    y = np.where(keep[:, 0], y, 0.0)
    reduce = tuple(range(1, y.ndim - 1)) if per_channel else tuple(range(1, y.ndim))

    def per_lead(values: Any) -> np.ndarray:
        arr = np.asarray(values, dtype=np.float64).reshape(horizon, -1)
        return np.where(finite[:, None], arr, np.inf)

    crps = crps_ensemble(ens, y, member_axis=1, fair=fair)
    scores = spread_skill(ens, y, member_axis=1, axis=reduce)
    ranks = ensemble_ranks(ens, y, member_axis=1, seed=seed).reshape(horizon, -1)
    hist = np.stack([np.bincount(r, minlength=m + 1) for r in ranks]) * finite[:, None]
    with np.errstate(invalid="ignore"):
        flatness = rank_flatness(hist)
    return {
        "crps": per_lead(np.mean(crps, axis=reduce)),
        "spread": per_lead(scores["spread"]),
        "ens_rmse": per_lead(scores["rmse"]),
        "spread_skill": per_lead(scores["ratio"]),
        "rank_histogram": hist.astype(np.int64),
        "rank_flatness": per_lead(flatness),
    }
