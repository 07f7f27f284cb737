"""`Ensemble` / `PosteriorEnsemble`: several networks' predicted distributions as one mixture."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipekit_train.core import (
    ConfigError,
    Ensemble,
    Flow,
    Gaussian,
    Mixture,
    PosteriorEnsemble,
    diagnostics,
    losses,
)


def _normal_pdf(x: np.ndarray, mean: float, std: float) -> np.ndarray:
    return np.exp(-0.5 * ((x - mean) / std) ** 2) / (std * math.sqrt(2 * math.pi))


def _flow(seed: int, batch: int = 2, d: int = 2) -> Flow:
    width = losses.flow_width(d, 2, 4)
    out = np.random.default_rng(seed).normal(0.0, 0.5, (batch, width))
    return Flow.from_output(out, flow_layers=2, flow_bins=4)


def test_two_gaussians_mix_by_their_weights() -> None:
    a = Gaussian(np.array([[-3.0]]), np.array([[0.5]]))
    b = Gaussian(np.array([[2.0]]), np.array([[1.0]]))
    mix = Ensemble((a, b), weights=[0.2, 0.8])
    draws = mix.sample(np.random.default_rng(0), 40_000)
    assert draws.shape == (40_000, 1, 1)
    near_a = np.mean(draws[:, 0, 0] < -0.5)
    assert abs(near_a - 0.2) < 0.01, near_a
    # the mixture's density, by hand
    grid = np.linspace(-5, 5, 11)[:, None, None]
    want = np.log(0.2 * _normal_pdf(grid, -3, 0.5) + 0.8 * _normal_pdf(grid, 2, 1.0))[..., 0]
    np.testing.assert_allclose(mix.log_prob(grid), want, rtol=1e-12)
    np.testing.assert_allclose(mix.mean, [[0.2 * -3.0 + 0.8 * 2.0]])
    assert abs(draws.mean() - mix.mean[0, 0]) < 0.03


def test_equal_weights_by_default_and_one_member_is_that_member() -> None:
    m = Mixture(
        np.array([[0.3, 0.7]]), np.array([[[0.0, 0.0], [1.0, 2.0]]]), np.array([[np.eye(2)] * 2])
    )
    one = Ensemble((m,))
    value = np.random.default_rng(1).normal(size=(5, 1, 2))
    np.testing.assert_allclose(one.log_prob(value), m.log_prob(value), rtol=1e-12)
    two = Ensemble((m, m))
    np.testing.assert_allclose(two.weights, [0.5, 0.5])
    np.testing.assert_allclose(two.log_prob(value), m.log_prob(value), rtol=1e-12)


def test_flows_truncated_to_a_box_as_one_mixture() -> None:
    f1, f2 = _flow(0), _flow(1)
    ens = Ensemble((f1, f2))
    low, high = -0.5, 0.8
    boxed = ens.within(low, high)
    acc = np.stack([member.acceptance for member in boxed.members])  # each flow's, MC
    assert np.all(acc < 0.99)  # the box cuts off mass, so the re-weighting matters
    # the density of the mixture restricted to the box: (sum_k w_k p_k) / (sum_k w_k acc_k)
    value = np.array([[0.1, 0.2], [0.5, -0.3]])[:, None, :]  # (2 points, 2 flows, d)
    raw = np.logaddexp(np.log(0.5) + f1.log_prob(value), np.log(0.5) + f2.log_prob(value))
    want = raw - np.log(0.5 * acc[0] + 0.5 * acc[1])
    np.testing.assert_allclose(boxed.log_prob(value), want, rtol=1e-10)
    np.testing.assert_allclose(boxed.acceptance, 0.5 * acc[0] + 0.5 * acc[1])
    assert float(ens.acceptance) == 1.0
    assert np.all(np.isneginf(boxed.log_prob(np.array([2.0, 0.0]))))
    draws = boxed.sample(np.random.default_rng(0), 500)
    assert draws.shape == (500, 2, 2)
    assert np.all((draws >= low) & (draws <= high))
    # per-flow weights: each flow of the batch re-weighted by its own mass in the box
    assert boxed.weights is not None and boxed.weights.shape == (2, 2)
    np.testing.assert_allclose(boxed.weights, acc / acc.sum(axis=0))
    one = boxed[1]
    assert len(one.members) == 2 and one.members[0].batch_shape == ()
    np.testing.assert_allclose(one.weights, boxed.weights[:, 1])
    assert one.acceptance == boxed.acceptance[1]
    assert len(boxed) == 2


def test_posterior_ensemble_feeds_the_diagnostics() -> None:
    class Shifted:
        def __init__(self, shift: float):
            self.shift = shift

        def distribution(self, x: np.ndarray) -> Gaussian:
            x = np.asarray(x, dtype=np.float64)
            return Gaussian(x + self.shift, np.ones_like(x))

    ensemble = PosteriorEnsemble([Shifted(-1.0), Shifted(1.0)])
    x = np.zeros((4, 1))
    draws = diagnostics.posterior_samples(ensemble, x, 20_000, seed=0)
    assert draws.shape == (20_000, 4, 1)
    assert abs(draws.mean()) < 0.02
    assert abs(draws.var() - 2.0) < 0.05  # mixture of N(-1, 1) and N(1, 1): variance 2
    assert "2 members" in repr(ensemble)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Ensemble(()), "non-empty sequence of distributions"),
        (lambda: Ensemble((object(),)), "non-empty sequence of distributions"),
        (lambda: Ensemble((_flow(0), _flow(1)), weights=[1.0]), r"one finite, non-negative"),
        (lambda: Ensemble((_flow(0), _flow(1)), weights=[1.0, -1.0]), "non-negative"),
        (lambda: Ensemble((_flow(0), _flow(1)), weights=[0.0, 0.0]), "all zero"),
        (lambda: PosteriorEnsemble([]), "non-empty sequence of posteriors"),
        (lambda: PosteriorEnsemble([object()]), "distribution"),
        (lambda: PosteriorEnsemble("ab"), "non-empty sequence of posteriors"),
        (
            lambda: Ensemble((Gaussian(np.zeros(2), np.ones(2)),)).within(0, 1),
            r"within.*Received: members of type \['Gaussian'\]",
        ),
    ],
)
def test_bad_input_is_refused(make, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=match):
        make()


def test_registered_members_load_back_as_one_ensemble(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pipekit_train.core import NeuralForward
    from pipekit_train.core.registry import LocalModelRegistry
    from pipekit_train.core.testing._numpy_model import NumpyLinearOp

    def op(seed: int) -> NumpyLinearOp:  # 3 inputs -> a Gaussian over 1 value (mean, log-var)
        return NumpyLinearOp(
            "pipekit_train.core.testing._numpy_model:linear", seed=seed, in_size=3, out_size=2
        )

    registry = LocalModelRegistry(tmp_path / "models")
    for seed in (0, 1, 2):
        registry.register("posterior", op(seed), head="gaussian")
    registry.register("posterior", op(3))  # version 4: a point head, not a member
    x = np.random.default_rng(0).normal(size=(5, 3))
    theta = np.random.default_rng(1).normal(size=(5, 1))

    loaded = PosteriorEnsemble.from_registry(registry, "posterior", [1, 3], weights=[3.0, 1.0])
    direct = PosteriorEnsemble(
        [NeuralForward(op(0), head="gaussian"), NeuralForward(op(2), head="gaussian")],
        weights=[3.0, 1.0],
    )
    np.testing.assert_allclose(loaded.weights, [0.75, 0.25])
    np.testing.assert_allclose(
        loaded.distribution(x).log_prob(theta), direct.distribution(x).log_prob(theta), rtol=1e-12
    )
    assert len(PosteriorEnsemble.from_registry(registry, "posterior", [1, 2, 3]).posteriors) == 3

    with pytest.raises(ConfigError, match=r"share a head.*version 1 .*'gaussian'.*version 4"):
        PosteriorEnsemble.from_registry(registry, "posterior", [1, 4])
    for bad in ([], [1, 1], "12", [True], [1.0]):
        with pytest.raises(ConfigError, match=r"Received: versions="):
            PosteriorEnsemble.from_registry(registry, "posterior", bad)
    with pytest.raises(ConfigError, match="9"):
        PosteriorEnsemble.from_registry(registry, "posterior", [1, 9])
