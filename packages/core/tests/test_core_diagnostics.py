"""Calibration diagnostics: SBC, expected coverage, TARP and C2ST on problems with a known answer.

The conjugate problem is sbibm's `gaussian_linear` in 3 dimensions: θ ~ N(0, 0.1 I),
x | θ ~ N(θ, 0.1 I), so the exact posterior is N(x / 2, 0.05 I). The exact posterior must
pass every check; one whose spread is shrunk (over-confident) or widened must fail them.
"""

from __future__ import annotations

import doctest
import math
from pathlib import Path

import numpy as np
import pytest

from pipekit_train.core import ConfigError, Gaussian, Mixture, diagnostics
from pipekit_train.core.diagnostics import (
    _ranks,
    _stats,
    c2st,
    central_coverage,
    check_coverage,
    check_sbc,
    hpd_coverage,
    posterior_samples,
    run_calibration,
    sbc_ranks,
    tarp,
)

N, D, S = 1000, 3, 200
PRIOR_VAR = NOISE_VAR = 0.1
POST_STD = math.sqrt(PRIOR_VAR * NOISE_VAR / (PRIOR_VAR + NOISE_VAR))  # sqrt(0.05)
LEVELS = (0.5, 0.68, 0.95)


@pytest.fixture(scope="module")
def simulations() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    theta = rng.normal(0.0, math.sqrt(PRIOR_VAR), size=(N, D))
    x = theta + rng.normal(0.0, math.sqrt(NOISE_VAR), size=(N, D))
    return theta, x


def posterior(spread: float = 1.0):
    """The exact posterior with its standard deviation multiplied by `spread`."""
    return lambda x: Gaussian(x / 2.0, np.full(np.shape(x), POST_STD * spread))


@pytest.fixture(scope="module")
def reports(simulations) -> dict[float, diagnostics.CalibrationReport]:
    theta, x = simulations
    return {
        spread: run_calibration(posterior(spread), theta, x, num_samples=S, seed=0)
        for spread in (1.0, 0.5, 2.0)
    }


# -- the conjugate problem ------------------------------------------------------------------


def test_exact_posterior_is_calibrated(reports) -> None:
    report = reports[1.0]
    for curve in (report.coverage_central, report.coverage_hpd):
        assert curve is not None
        check = curve.check(LEVELS, tolerance=0.05)
        assert check.passed, (curve.method, check.coverage)
        assert np.all(np.abs(check.error) <= 0.05)
    assert report.sbc.passed
    assert np.all(report.sbc.chi2_pvalue > 0.01)
    assert report.tarp.passed()
    assert abs(report.tarp.atc) < 0.02
    assert report.passed
    assert report.metrics()["calibrated"] == 1.0


def test_over_confident_posterior_fails_every_check(reports) -> None:
    report = reports[0.5]
    for curve in (report.coverage_central, report.coverage_hpd):
        assert curve is not None
        check = curve.check(LEVELS)
        assert not check.passed
        assert np.all(check.error < -0.05)  # the truth is outside the region too often
    assert not report.sbc.passed and not np.any(report.sbc.inside_band)
    assert np.all(report.sbc.chi2_pvalue < 1e-6)
    assert not report.tarp.passed() and report.tarp.atc < -0.03
    assert not report.passed
    assert report.metrics()["calibrated"] == 0.0


def test_under_confident_posterior_fails_the_other_way(reports) -> None:
    report = reports[2.0]
    check = report.coverage_central.check(LEVELS)
    assert not check.passed and np.all(check.error[:2] > 0.05)
    assert report.tarp.atc > 0.03
    assert not report.sbc.passed


def test_sbc_ecdf_shapes_of_over_and_under_confidence(reports) -> None:
    # too narrow: the truth ranks at the extremes, the ECDF jumps at both ends, so its
    # difference leaves the band above at low ranks and below at high ranks; too wide:
    # the ranks crowd the middle, the other way round
    k = len(reports[0.5].sbc.points)
    early, late = slice(k // 10, k // 5), slice(-(k // 5), -(k // 10))
    narrow, wide = reports[0.5].sbc, reports[2.0].sbc
    assert np.all(narrow.ecdf_difference[early] > narrow.band_upper[early, None])
    assert np.all(narrow.ecdf_difference[late] < narrow.band_lower[late, None])
    assert np.all(wide.ecdf_difference[early] < wide.band_lower[early, None])
    assert np.all(wide.ecdf_difference[late] > wide.band_upper[late, None])


def test_a_biased_posterior_is_flagged_by_sbc(simulations) -> None:
    theta, x = simulations
    shifted = lambda x: Gaussian(x / 2.0 + 0.5 * POST_STD, np.full(np.shape(x), POST_STD))  # noqa: E731
    check = check_sbc(sbc_ranks(posterior_samples(shifted, x, S, seed=3), theta), S)
    assert not check.passed and np.all(check.ks_pvalue < 1e-3)


def test_mixture_posterior_runs_through_log_prob(simulations) -> None:
    # the exact posterior written as a one-component full-covariance Mixture
    theta, x = simulations

    def as_mixture(x):
        n = len(x)
        tril = np.broadcast_to(np.eye(D) * POST_STD, (n, 1, D, D))
        return Mixture(np.ones((n, 1)), (x / 2.0)[:, None, :], tril)

    report = run_calibration(as_mixture, theta, x, num_samples=100, batch_size=128)
    assert report.coverage_hpd is not None
    assert report.coverage_hpd.check(LEVELS).passed and report.passed
    # the mixture's joint log-density is the Gaussian's per-element ones summed
    dist = as_mixture(x[:5])
    np.testing.assert_allclose(
        dist.log_prob(theta[:5]), posterior()(x[:5]).log_prob(theta[:5]).sum(-1), rtol=1e-12
    )


def test_a_neural_forward_like_object_is_read_through_distribution(simulations) -> None:
    theta, x = simulations

    class Forward:
        def distribution(self, state):
            return posterior()(state)

    a = run_calibration(Forward(), theta[:100], x[:100], num_samples=50, seed=4)
    b = run_calibration(posterior(), theta[:100], x[:100], num_samples=50, seed=4)
    np.testing.assert_array_equal(a.sbc.ranks, b.sbc.ranks)


def test_sampling_only_distribution_skips_hpd(simulations) -> None:
    theta, x = simulations

    class Draws:
        def __init__(self, x):
            self.inner = posterior()(x)

        def sample(self, rng, n):
            return self.inner.sample(rng, n)

    report = run_calibration(Draws, theta[:100], x[:100], num_samples=50)
    assert report.coverage_hpd is None
    assert "coverage_hpd_50" not in report.metrics()
    assert "coverage_central_50" in report.metrics()


def test_one_parameter_without_its_axis() -> None:
    rng = np.random.default_rng(0)
    theta = rng.normal(size=200)
    samples = theta[None, :] + rng.normal(size=(50, 200)) * 0  # all draws at the truth
    samples = samples + rng.normal(size=(50, 200))
    ranks = sbc_ranks(samples, theta)
    assert ranks.shape == (200, 1) and ranks.min() >= 0 and ranks.max() <= 50
    assert central_coverage(samples, theta).credibility.shape == (200, 1)
    assert tarp(samples, theta).credibility.shape == (200,)


# -- the statistics --------------------------------------------------------------------------


def test_ranks_count_draws_below_the_truth() -> None:
    samples = np.arange(20.0)[:, None, None] * np.ones((1, 20, 1))
    theta = np.arange(20.0)[:, None] + 0.5
    assert sbc_ranks(samples, theta)[:, 0].tolist() == list(range(1, 21))


def test_chi2_and_kolmogorov_against_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")  # scipy comes with scikit-learn (dev group)
    for x, k in [(0.5, 1), (3.0, 4), (30.0, 19), (100.0, 19), (1e-3, 3), (50.0, 10)]:
        assert _stats.chi2_sf(x, k) == pytest.approx(stats.chi2.sf(x, k), rel=1e-9, abs=1e-300)
    for d, n in [(0.05, 100), (0.1, 50), (0.2, 20), (0.03, 1000)]:
        assert _stats.kolmogorov_sf(d, n) == pytest.approx(stats.kstwo.sf(d, n), abs=0.015)
    p = np.array([0.1, 0.5, 0.93])
    table = _stats.binomial_cdf_table(50, p)
    expected = stats.binom.cdf(np.arange(51), 50, p[:, None])
    np.testing.assert_allclose(table, expected, atol=1e-12)


def test_ecdf_band_holds_its_level_on_fresh_uniform_ranks() -> None:
    n, s, alpha = 100, 99, 0.1
    cuts = _ranks.ecdf_points(s, 50)
    lower, upper = _ranks.ecdf_band(n, cuts / (s + 1), alpha=alpha, seed=0)
    rng = np.random.default_rng(123)  # not the band's seed
    inside = []
    for _ in range(400):
        diff = _ranks.ecdf_difference(rng.integers(0, s + 1, n), s, cuts)
        inside.append(np.all((diff >= lower - 1e-9) & (diff <= upper + 1e-9)))
    # 1 - alpha = 0.9 of calibrated rank sets stay inside; 400 sets: ± 0.045 at 3 sigma
    assert abs(np.mean(inside) - (1 - alpha)) < 0.05
    assert np.all(lower < 0) and np.all(upper > 0)


def test_chi2_uniformity_rejects_a_lopsided_histogram() -> None:
    rng = np.random.default_rng(0)
    flat = rng.integers(0, 100, 500)
    lopsided = np.minimum(rng.integers(0, 100, 500), 60)
    assert _ranks.chi2_uniformity(flat, 99, 20)[1] > 0.01
    assert _ranks.chi2_uniformity(lopsided, 99, 20)[1] < 1e-10


def test_hpd_coverage_from_log_probs() -> None:
    rng = np.random.default_rng(0)
    lp_samples = rng.normal(size=(100, 400))
    lp_theta = rng.normal(size=400)  # the truth's density is like a draw's: calibrated
    curve = hpd_coverage(lp_samples, lp_theta)
    assert check_coverage(curve, tolerance=0.08).passed
    low = hpd_coverage(lp_samples, lp_theta - 2.0)  # truth in the tails: over-confident
    assert not low.check().passed and np.all(low.check().error < 0)


# -- C2ST ------------------------------------------------------------------------------------


def test_c2st_is_chance_for_one_distribution_and_one_for_separated() -> None:
    pytest.importorskip("sklearn")
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(300, 2)), rng.normal(size=(300, 2))
    assert abs(c2st(a, b, seed=1) - 0.5) < 0.08
    far = rng.normal(size=(300, 2)) + 6.0
    assert c2st(a, far, seed=1) > 0.97
    assert c2st(a, b, seed=1) == c2st(a, b, seed=1)  # seeded


def test_c2st_refuses_too_few_samples_for_its_folds() -> None:
    a = np.zeros((9, 2))
    with pytest.raises(ConfigError, match=r"len\(a\)=9.*fewer folds"):
        c2st(a, np.ones((50, 2)), folds=5)
    with pytest.raises(ConfigError, match=r"a.shape=\(50, 2\), b.shape=\(50, 3\)"):
        c2st(np.zeros((50, 2)), np.zeros((50, 3)))
    with pytest.raises(ConfigError, match="folds=1"):
        c2st(np.zeros((50, 2)), np.zeros((50, 2)), folds=1)


def test_c2st_without_sklearn_names_the_extra(monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "sklearn", None)
    with pytest.raises(ImportError, match=r"pipekit-train-core\[diagnostics\]"):
        c2st(np.zeros((50, 2)), np.ones((50, 2)))


# -- bad input, refused before any work ------------------------------------------------------


def test_too_few_simulations_are_refused(simulations) -> None:
    theta, x = simulations
    with pytest.raises(ConfigError, match="num_simulations=10.*Simulate more"):
        sbc_ranks(np.zeros((50, 10, 3)), theta[:10])
    with pytest.raises(ConfigError, match="num_simulations=19"):
        run_calibration(posterior(), theta[:19], x[:19])
    with pytest.raises(ConfigError, match="num_simulations=5"):
        check_sbc(np.zeros((5, 2), dtype=int), 50)


def test_too_few_posterior_draws_are_refused(simulations) -> None:
    theta, x = simulations
    with pytest.raises(ConfigError, match="num_samples=10"):
        run_calibration(posterior(), theta, x, num_samples=10)
    with pytest.raises(ConfigError, match="num_samples=5"):
        tarp(np.zeros((5, 100, 3)), theta[:100])


def test_mismatched_shapes_are_refused(simulations) -> None:
    theta, x = simulations
    with pytest.raises(ConfigError, match=r"samples.shape=\(50, 100, 2\), theta.shape=\(100, 3\)"):
        sbc_ranks(np.zeros((50, 100, 2)), theta[:100])
    with pytest.raises(ConfigError, match=r"theta.shape=\(100, 3\), x.shape=\(90, 3\)"):
        run_calibration(posterior(), theta[:100], x[:90])
    with pytest.raises(ConfigError, match="draws 2 parameters but `theta` has 3"):
        run_calibration(lambda x: Gaussian(x[:, :2], np.ones((len(x), 2))), theta, x)
    with pytest.raises(ConfigError, match=r"references.shape=\(100, 2\)"):
        tarp(np.zeros((50, 100, 3)), theta[:100], references=np.zeros((100, 2)))
    with pytest.raises(ConfigError, match=r"log_prob_theta.shape=\(99,\)"):
        hpd_coverage(np.zeros((50, 100)), np.zeros(99))


def test_other_bad_input_is_refused(simulations) -> None:
    theta, x = simulations
    with pytest.raises(ConfigError, match="posterior=int"):
        run_calibration(3, theta, x)
    with pytest.raises(ConfigError, match="tolerance=2"):
        run_calibration(posterior(), theta, x, tolerance=2)
    with pytest.raises(ConfigError, match="ranks in 60..60 with num_samples=50"):
        check_sbc(np.full((30, 1), 60), 50)
    with pytest.raises(ConfigError, match="alpha=1.5"):
        check_sbc(np.zeros((30, 1), dtype=int), 50, alpha=1.5)
    with pytest.raises(ConfigError, match="levels"):
        check_coverage(central_coverage(np.zeros((50, 30)), np.zeros(30)), levels=(0.5, 1.2))
    with pytest.raises(ConfigError, match="NaN/inf"):
        sbc_ranks(np.full((50, 30, 1), np.nan), np.zeros((30, 1)))
    with pytest.raises(ConfigError, match="parameter_names"):
        check_sbc(np.zeros((30, 2), dtype=int), 50, parameter_names=["a"])


# -- plots and the docstring ----------------------------------------------------------------


def test_plots_are_written_as_png(reports, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    paths = reports[0.5].plot(tmp_path / "calibration")
    assert sorted(paths) == ["coverage", "sbc", "tarp"]
    for path in paths.values():
        assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_module_docstring_example_runs() -> None:
    result = doctest.testmod(diagnostics, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_tarp_with_given_references_and_units_that_differ(simulations) -> None:
    theta, x = simulations
    samples = posterior_samples(posterior(), x, 100, seed=5)
    scale = np.array([1.0, 100.0, 0.01])  # parameters in very different units
    refs = np.random.default_rng(6).uniform(-1, 1, theta.shape)
    base = tarp(samples, theta, references=refs)
    scaled = tarp(samples * scale, theta * scale, references=refs * scale)
    # z-scored distances: rescaling a parameter changes nothing
    np.testing.assert_allclose(scaled.ecp, base.ecp)
    assert base.passed() and abs(base.atc) < 0.03
    narrow = posterior_samples(posterior(0.5), x, 100, seed=5)
    assert tarp(narrow, theta, references=refs).atc < -0.03


def test_check_sbc_with_chosen_bins_and_names(simulations) -> None:
    theta, x = simulations
    ranks = sbc_ranks(posterior_samples(posterior(), x, 99, seed=7), theta)
    check = check_sbc(ranks, 99, bins=10, parameter_names=["a", "b", "c"])
    assert check.bins == 10 and check.parameter_names == ("a", "b", "c")
    assert check.ecdf_difference.shape == (len(check.points), 3)
    assert np.all(check.band_lower < 0) and np.all(check.band_upper > 0)
    assert set(check.metrics()) == {"sbc_chi2_pvalue_min", "sbc_ks_pvalue_min", "sbc_inside_band"}
    with pytest.raises(ConfigError, match="bins=1"):
        check_sbc(ranks, 99, bins=1)
