"""Ensemble scores: CRPS (fair and standard), spread–skill, rank histograms, per lead.

Checked against brute-force references (the pairwise CRPS, a numerical integral of the
Gaussian CRPS) and known properties: the fair CRPS is unbiased for the CRPS of the
distribution the members are drawn from, a calibrated ensemble has a spread–skill ratio
near 1 and a flat rank histogram, an under-dispersive one neither.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipekit_train.core import ConfigError
from pipekit_train.core.metrics import (
    crps_ensemble,
    crps_gaussian,
    ensemble_lead_metrics,
    ensemble_ranks,
    lead_windows,
    rank_flatness,
    rank_histogram,
    spread_skill,
    summarize,
)


def _pairwise_crps(ens: np.ndarray, y: np.ndarray, fair: bool) -> np.ndarray:
    """The CRPS from its definition, members on axis 0: every pair of members."""
    m = ens.shape[0]
    skill = np.abs(ens - y[None]).mean(axis=0)
    pairs = np.abs(ens[:, None] - ens[None, :]).sum(axis=(0, 1))
    return skill - pairs / (2 * m * (m - 1 if fair else m))


def _integrated_crps(mu: float, sigma: float, y: float) -> float:
    """∫ (F(x) - 1{x >= y})² dx, F the normal CDF: trapezoids on each side of the jump."""

    def cdf(x: np.ndarray) -> np.ndarray:
        return 0.5 * (1 + np.array([math.erf(v) for v in (x - mu) / (sigma * math.sqrt(2))]))

    below = np.linspace(min(y, mu) - 12 * sigma, y, 100_001)
    above = np.linspace(y, max(y, mu) + 12 * sigma, 100_001)
    return float(np.trapezoid(cdf(below) ** 2, below) + np.trapezoid((1 - cdf(above)) ** 2, above))


def _calibrated(n: int, m: int, spread: float = 1.0, seed: int = 0):
    """Cases with random centres; members and truth drawn from N(centre, 1) (members'
    std times `spread`): `(M, n)` members, `(n,)` truth."""
    rng = np.random.default_rng(seed)
    centre = rng.normal(0.0, 3.0, n)
    members = centre + spread * rng.standard_normal((m, n))
    truth = centre + rng.standard_normal(n)
    return members, truth


def test_crps_matches_the_pairwise_definition_on_any_member_axis() -> None:
    rng = np.random.default_rng(1)
    ens, y = rng.normal(size=(7, 5, 3)), rng.normal(size=(5, 3))
    for fair in (True, False):
        want = _pairwise_crps(ens, y, fair)
        np.testing.assert_allclose(crps_ensemble(ens, y, fair=fair), want, rtol=1e-12)
        moved = np.moveaxis(ens, 0, 2)  # (5, 3, 7)
        got = crps_ensemble(moved, y, member_axis=-1, fair=fair)
        np.testing.assert_allclose(got, want, rtol=1e-12)
    # one member: the standard CRPS is the absolute error; the fair one is undefined
    assert crps_ensemble(np.array([1.5]), 0.25, fair=False) == 1.25
    with pytest.raises(ConfigError, match=r"fair CRPS.*at least 2.*Received: 1 member"):
        crps_ensemble(np.array([[1.5, 2.0]]), np.array([0.0, 0.0]))
    with pytest.raises(ConfigError, match=r"truth shape \(5,\), expected \(5, 3\)"):
        crps_ensemble(ens, y[:, 0])
    with pytest.raises(ConfigError, match="member_axis=3"):
        crps_ensemble(ens, y, member_axis=3)


def test_gaussian_closed_form_matches_the_integral() -> None:
    for mu, sigma, y in ((0.0, 1.0, 0.0), (1.0, 0.5, 2.2), (-3.0, 2.0, -1.0)):
        assert crps_gaussian(mu, sigma, y) == pytest.approx(
            _integrated_crps(mu, sigma, y), rel=1e-6
        )
    # broadcasting, and a point mass scores the absolute error
    got = crps_gaussian(np.zeros(3), np.array([1.0, 0.0, 2.0]), np.array([0.0, -2.0, 0.0]))
    np.testing.assert_allclose(got, [0.233695, 2.0, 2 * 0.233695], atol=1e-6)
    with pytest.raises(ConfigError, match="non-negative"):
        crps_gaussian(0.0, -1.0, 0.0)


def test_fair_crps_of_a_large_sample_is_the_closed_form() -> None:
    rng = np.random.default_rng(2)
    sample = 1.5 + 0.7 * rng.standard_normal(50_000)
    for y in (1.5, 0.2, 3.0):
        assert crps_ensemble(sample, y) == pytest.approx(crps_gaussian(1.5, 0.7, y), rel=1e-2)


def test_fair_crps_is_unbiased_for_small_ensembles_and_the_standard_one_is_not() -> None:
    # 3 members: E[standard CRPS] = CRPS + E|X - X'| / (2M) = CRPS + σ / (√π M)
    rng = np.random.default_rng(3)
    n, m, sigma = 40_000, 3, 1.3
    truth = sigma * rng.standard_normal(n)
    members = sigma * rng.standard_normal((m, n))
    exact = crps_gaussian(0.0, sigma, truth)
    for fair, bias in ((True, 0.0), (False, sigma / (math.sqrt(math.pi) * m))):
        diff = crps_ensemble(members, truth, fair=fair) - exact
        standard_error = diff.std() / math.sqrt(n)
        assert abs(diff.mean() - bias) < 4 * standard_error, (fair, diff.mean(), bias)
    assert bias > 30 * standard_error  # the two expectations are told apart


def test_spread_skill_is_one_for_a_calibrated_ensemble() -> None:
    members, truth = _calibrated(40_000, 5)
    scores = spread_skill(members, truth)
    assert scores["spread"] == pytest.approx(1.0, rel=0.02)
    assert scores["rmse"] == pytest.approx(math.sqrt(6 / 5), rel=0.02)
    # the finite-ensemble factor: without it the ratio would be sqrt(5/6) = 0.913
    assert scores["ratio"] == pytest.approx(1.0, abs=0.025)
    narrow = spread_skill(*_calibrated(40_000, 5, spread=0.5))
    assert narrow["ratio"] < 0.6
    # against numpy per axis: (M, 4, 3) members, averaged over truth axis 0
    rng = np.random.default_rng(4)
    ens, y = rng.normal(size=(6, 4, 3)), rng.normal(size=(4, 3))
    per = spread_skill(ens, y, axis=0)
    np.testing.assert_allclose(per["rmse"], np.sqrt(((ens.mean(0) - y) ** 2).mean(0)))
    np.testing.assert_allclose(per["spread"], np.sqrt(ens.var(0, ddof=1).mean(0)))
    np.testing.assert_allclose(per["ratio"], math.sqrt(7 / 6) * per["spread"] / per["rmse"])
    with pytest.raises(ConfigError, match="at least 2"):
        spread_skill(ens[:1], y)


def test_rank_histogram_is_flat_when_calibrated_and_u_shaped_when_too_narrow() -> None:
    m = 9
    counts = rank_histogram(*_calibrated(20_000, m))
    assert counts.shape == (m + 1,) and counts.sum() == 20_000
    assert rank_flatness(counts) < 3.0  # expectation 1, sd sqrt(2/9)
    narrow = rank_histogram(*_calibrated(20_000, m, spread=0.3))
    assert narrow[0] > 3 * narrow[m // 2] and narrow[-1] > 3 * narrow[m // 2]  # a U
    assert rank_flatness(narrow) > 100.0
    assert rank_flatness(np.array([[5, 5], [10, 0]])).tolist() == [0.0, 10.0]
    with pytest.raises(ConfigError, match="at least 2 bins"):
        rank_flatness(np.array([3]))


def test_ties_are_broken_at_random_with_the_seed() -> None:
    ens, y = np.zeros((4, 5_000)), np.zeros(5_000)  # every member equals the truth
    ranks = ensemble_ranks(ens, y, seed=7)
    np.testing.assert_array_equal(ranks, ensemble_ranks(ens, y, seed=7))
    assert not np.array_equal(ranks, ensemble_ranks(ens, y, seed=8))
    assert rank_flatness(np.bincount(ranks, minlength=5)) < 4.0  # uniform on 0..4
    # ties only among some members: 1 below, 2 equal → rank 1, 2 or 3
    one = ensemble_ranks(np.array([[-1.0], [0.0], [0.0], [1.0]]), np.array([0.0]), seed=0)
    assert one[0] in (1, 2, 3)
    with pytest.raises(ConfigError, match="finite"):
        ensemble_ranks(np.array([[np.nan]]), np.array([0.0]))
    with pytest.raises(ConfigError, match="seed=-1"):
        ensemble_ranks(ens, y, seed=-1)


def test_lead_metrics_score_each_lead_and_name_the_windows() -> None:
    rng = np.random.default_rng(5)
    n, h, m = 6, 12, 4
    truth = rng.normal(size=(n, h, 8, 2))  # a 1-D grid of 8 points, 2 channels
    ens = (
        truth[:, :, None]
        + rng.normal(size=(n, h, m, 8, 2)) * np.linspace(0.1, 2, h)[None, :, None, None, None]
    )
    pooled = ensemble_lead_metrics(ens, truth, seed=1)
    assert pooled["crps"].shape == (h, 1) and pooled["rank_histogram"].shape == (h, m + 1)
    for lead in (0, 7):
        members = np.moveaxis(ens[:, lead], 1, 0)  # (M, n, 8, 2)
        want = crps_ensemble(members, truth[:, lead]).mean()
        assert pooled["crps"][lead, 0] == pytest.approx(want, rel=1e-12)
        scores = spread_skill(members, truth[:, lead])
        assert pooled["spread"][lead, 0] == pytest.approx(scores["spread"], rel=1e-12)
        assert pooled["ens_rmse"][lead, 0] == pytest.approx(scores["rmse"], rel=1e-12)
        assert pooled["spread_skill"][lead, 0] == pytest.approx(scores["ratio"], rel=1e-12)
        assert pooled["rank_histogram"][lead].sum() == n * 8 * 2
    assert np.all(np.diff(pooled["spread"][:, 0]) > 0)  # the members spread out with lead
    per = ensemble_lead_metrics(ens, truth, per_channel=True)
    assert per["crps"].shape == (h, 2) and per["rank_flatness"].shape == (h, 1)
    np.testing.assert_allclose(per["crps"].mean(axis=1), pooled["crps"][:, 0], rtol=1e-12)
    # a diverged member scores inf from its lead on
    bad = ens.copy()
    bad[2, 9, 1, 0, 0] = np.nan
    broken = ensemble_lead_metrics(bad, truth)
    assert np.isinf(broken["crps"][9]).all() and np.isfinite(broken["crps"][:9]).all()
    assert broken["rank_histogram"][9].sum() == 0 and np.isinf(broken["rank_flatness"][9, 0])
    scores = {k: v for k, v in pooled.items() if k != "rank_histogram"}
    names = summarize(scores, lead_windows(h, (4,)), prefix="val_rollout_")
    assert {
        "val_rollout_crps",
        "val_rollout_crps_lead_1_4",
        "val_rollout_spread_skill_lead_5_12",
        "val_rollout_ens_rmse",
        "val_rollout_rank_flatness_lead_1_4",
    } <= set(names)
    with pytest.raises(ConfigError, match="at least 2 ensemble members"):
        ensemble_lead_metrics(ens[:, :, :1], truth)
    with pytest.raises(ConfigError, match="truth.shape"):
        ensemble_lead_metrics(ens[0, :, :, 0, 0], truth[0, :, 0, 0], member_axis=1)
