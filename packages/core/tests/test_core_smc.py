"""`smc_sample`, `BoxPrior` and `LikelihoodPosterior`: posterior draws from a likelihood."""

from __future__ import annotations

import numpy as np
import pytest

from pipekit_train.core import BoxPrior, ConfigError, Gaussian, LikelihoodPosterior, smc_sample


def _linear_gaussian(x_o: np.ndarray, a: np.ndarray, sigma: float):
    def log_lik(theta: np.ndarray) -> np.ndarray:
        r = (x_o - theta @ a.T) / sigma
        return -0.5 * np.sum(r * r, axis=1)

    return log_lik


def test_smc_matches_the_conjugate_posterior() -> None:
    """A linear-Gaussian likelihood under a wide box: the posterior is normal, known exactly."""
    a = np.array([[1.0, 0.5], [0.0, 2.0], [1.0, -1.0]])
    sigma, x_o = 0.2, np.array([0.3, -0.8, 1.1])
    info: dict = {}
    prior = BoxPrior([-10, -10], [10, 10])
    draws = smc_sample(_linear_gaussian(x_o, a, sigma), prior, 2000, seed=1, info=info)
    precision = a.T @ a / sigma**2
    cov = np.linalg.inv(precision)
    mean = cov @ a.T @ x_o / sigma**2
    sd = np.sqrt(np.diag(cov))
    assert draws.shape == (2000, 2)
    assert np.all(np.abs(draws.mean(axis=0) - mean) < 0.1 * sd)
    assert np.allclose(np.cov(draws.T), cov, rtol=0.15, atol=0.05 * sd.max() ** 2)
    assert info["stages"] > 3 and info["betas"][-1] == 1.0
    small = [smc_sample(_linear_gaussian(x_o, a, sigma), prior, 200, seed=s) for s in (1, 1, 2)]
    assert np.array_equal(small[0], small[1])  # the seed fixes every choice
    assert not np.array_equal(small[0], small[2])


def test_smc_keeps_the_modes_shares() -> None:
    """Two narrow modes at θ₁ = ±1 (weights 0.8 and 0.2): a chain started in one would
    keep it; the tempered particles hold both in their right proportion (within 0.02 over
    seeds 0-5, measured; equal modes likewise: `test_sbi_tasks.py` on slcp's four)."""
    share = 0.8

    def log_lik(theta: np.ndarray) -> np.ndarray:
        width = 0.05
        plus = np.log(share) - 0.5 * np.sum((theta - [1.0, 0.0]) ** 2, axis=1) / width**2
        minus = np.log(1 - share) - 0.5 * np.sum((theta - [-1.0, 0.0]) ** 2, axis=1) / width**2
        return np.logaddexp(plus, minus)

    draws = smc_sample(log_lik, BoxPrior([-3, -3], [3, 3]), 4000, seed=0)
    assert abs(np.mean(draws[:, 0] > 0) - share) < 0.04
    right = draws[draws[:, 0] > 0]
    assert abs(right[:, 0].std() - 0.05) < 0.01  # the within-mode spread, not the mixture's


def test_the_likelihood_sees_n_rows_inside_the_support_every_call() -> None:
    """A posterior pressed against the box's edge, so many proposals fall outside: the
    likelihood is still called with all `n` rows each time (one compile for a jax or Keras
    network), never at a θ outside the box, and the draws stay inside."""
    a, sigma, x_o = np.eye(2), 0.3, np.array([0.95, 0.0])
    inner = _linear_gaussian(x_o, a, sigma)
    seen: list[tuple[int, ...]] = []
    outside = []

    def log_lik(theta: np.ndarray) -> np.ndarray:
        seen.append(theta.shape)
        outside.append(bool(np.any(np.abs(theta) > 1.0)))
        return inner(theta)

    draws = smc_sample(log_lik, BoxPrior([-1, -1], [1, 1]), 500, seed=0)
    assert set(seen) == {(500, 2)} and len(seen) > 20
    assert not any(outside)
    assert np.all(np.abs(draws) <= 1.0) and np.mean(draws[:, 0] > 0.5) > 0.5


def test_both_kernels_match_the_posterior_and_count_their_calls() -> None:
    """The default `kernel="walk"` and `kernel="mixture"` both find the conjugate
    posterior; `info["calls"]` is the likelihood calls made, and the mixture kernel (with
    its own defaults) makes about a tenth of the walk's."""
    a, sigma, x_o = np.eye(2), 0.3, np.array([0.5, -0.5])
    counts = {}
    for kernel, options in [
        ("walk", {"ess": 0.9, "moves": 20, "final_moves": 40, "clusters": 8}),
        ("mixture", {}),
    ]:
        seen: list[int] = []

        def log_lik(theta: np.ndarray, seen: list[int] = seen) -> np.ndarray:
            seen.append(len(theta))
            return _linear_gaussian(x_o, a, sigma)(theta)

        info: dict = {}
        prior = BoxPrior([-5, -5], [5, 5])
        draws = smc_sample(log_lik, prior, 1000, seed=0, kernel=kernel, info=info, **options)
        assert np.all(np.abs(draws.mean(axis=0) - x_o) < 0.1 * sigma)
        assert np.all(np.abs(draws.std(axis=0) - sigma) < 0.1 * sigma)
        assert (
            info["calls"]
            == len(seen)
            == 1 + info["stages"] * options.get("moves", 4) + (options.get("final_moves", 8))
        )
        counts[kernel] = len(seen)
    assert counts["mixture"] * 5 < counts["walk"]


def test_smc_flags_too_narrow_draws() -> None:
    """The check of the conjugate test can fail: draws shrunk about their mean do not pass."""
    a, sigma, x_o = np.eye(2), 0.3, np.array([0.5, -0.5])
    draws = smc_sample(_linear_gaussian(x_o, a, sigma), BoxPrior([-5, -5], [5, 5]), 3000, seed=2)
    assert abs(draws.std(axis=0) - sigma).max() < 0.05 * sigma * 3
    shrunk = x_o + 0.7 * (draws - x_o)
    assert abs(shrunk.std(axis=0) - sigma).max() > 0.2 * sigma


class _PointModel:
    """A likelihood 'network': `distribution(θ)` is N(θ, 1) over one 1-D point."""

    def distribution(self, theta: np.ndarray) -> Gaussian:
        theta = np.asarray(theta, dtype=np.float64)
        return Gaussian(theta[:, :1], np.ones((len(theta), 1)))


def test_likelihood_posterior_multiplies_iid_points() -> None:
    """Five i.i.d. points of N(θ, 1): the posterior is N(mean(x), 1/5) (under a wide box)."""
    x_o = np.array([0.2, 1.1, -0.4, 0.9, 0.6])
    posterior = LikelihoodPosterior(_PointModel(), BoxPrior([-8.0], [8.0]), point_size=1)
    draws = posterior.sample(x_o, 4000, seed=0)
    assert draws.shape == (4000, 1)
    assert abs(draws.mean() - x_o.mean()) < 0.05
    assert abs(draws.std() - np.sqrt(1 / 5)) < 0.03
    one = LikelihoodPosterior(_PointModel(), BoxPrior([-8.0], [8.0]))  # all of x is one point
    theta = np.array([[0.0], [0.5]])
    assert np.allclose(
        one.log_likelihood(x_o[:1])(theta),
        -0.5 * (0.2 - theta[:, 0]) ** 2 - 0.5 * np.log(2 * np.pi),
    )
    small = LikelihoodPosterior(_PointModel(), BoxPrior([-8.0], [8.0]), point_size=1, batch_size=3)
    grid = np.linspace(-1, 1, 7)[:, None]
    assert np.allclose(small.log_likelihood(x_o)(grid), posterior.log_likelihood(x_o)(grid))


def test_gaussian_prior_and_box_prior() -> None:
    """Any object with `sample` and `log_prob` is a prior (an element-wise `Gaussian` too)."""
    prior = Gaussian(np.zeros(2), np.ones(2))
    a, sigma, x_o = np.eye(2), 1.0, np.array([1.0, -1.0])
    draws = smc_sample(_linear_gaussian(x_o, a, sigma), prior, 4000, seed=3)
    assert np.all(np.abs(draws.mean(axis=0) - x_o / 2) < 0.05)  # N(x/2, 1/2)
    assert np.all(np.abs(draws.var(axis=0) - 0.5) < 0.06)
    box = BoxPrior([0, 0], [1, 2])
    assert np.allclose(box.log_prob([[0.5, 1.0], [1.5, 1.0]]), [-np.log(2), -np.inf])
    inside = box.sample(np.random.default_rng(0), 100)
    assert inside.shape == (100, 2) and np.all(np.isfinite(box.log_prob(inside)))


def _flat(theta: np.ndarray) -> np.ndarray:
    return np.zeros(len(theta))


class _ShortPrior(BoxPrior):
    """A prior whose `sample` returns half the rows asked for."""

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return super().sample(rng, n // 2)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: smc_sample(_flat, BoxPrior([0, 0], [1, 1]), 5), "Received: n=5"),
        (lambda: smc_sample(_flat, BoxPrior([0], [1]), 100, ess=1.0), "Received: ess=1.0"),
        (lambda: smc_sample(_flat, BoxPrior([0], [1]), 100, moves=0), "Received: moves=0"),
        (
            lambda: smc_sample(_flat, BoxPrior([0], [1]), 100, kernel="hmc"),
            "Received: kernel='hmc'",
        ),
        (lambda: smc_sample(_flat, object(), 100), "`prior` must have"),
        (lambda: smc_sample(_flat, _ShortPrior([0], [1]), 100), "must return (100, d)"),
        (lambda: smc_sample("f", BoxPrior([0], [1]), 100), "`log_likelihood` must be"),
        (
            lambda: smc_sample(lambda t: np.zeros((len(t), 2)), BoxPrior([0], [1]), 100),
            "shape (100,)",
        ),
        (lambda: smc_sample(lambda t: t[:, 0] * np.nan, BoxPrior([0], [1]), 100), "NaN or +inf"),
        (
            lambda: smc_sample(lambda t: t[:, 0] - np.inf, BoxPrior([0], [1]), 100),
            "-inf at all 100",
        ),
        (lambda: BoxPrior([0, 1], [1, 1]), "`low` must be below `high`"),
        (lambda: BoxPrior([0, 1], [1]), "of one shape"),
        (lambda: LikelihoodPosterior(object(), BoxPrior([0], [1])), "`distribution(theta)`"),
        (
            lambda: LikelihoodPosterior(_PointModel(), BoxPrior([0], [1]), point_size=0),
            "point_size=0",
        ),
        (
            lambda: LikelihoodPosterior(
                _PointModel(), BoxPrior([0], [1]), point_size=2
            ).log_likelihood(np.zeros(3)),
            "whole points of point_size=2",
        ),
    ],
)
def test_bad_input_is_refused_before_any_work(call, message: str) -> None:
    with pytest.raises(ConfigError, match=None) as caught:
        call()
    assert message in str(caught.value)
