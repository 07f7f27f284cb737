"""The mixture head: `Mixture` (sample, log_prob, mean, weights), `NeuralForward(head="mixture")`
in original units, and the head with its options through the registry."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipekit_train.core import LocalModelRegistry, Mixture, NeuralForward, losses
from pipekit_train.core._errors import ConfigError, IntegrityError
from pipekit_train.core.data import Normalizer
from pipekit_train.core.testing._numpy_model import NumpyLinearOp

FACTORY = "pipekit_train.core.testing._numpy_model:linear"


def mixture_op(k: int = 3, d: int = 2, covariance: str = "diag", seed: int = 0) -> NumpyLinearOp:
    """A linear model with `mixture_width(k, d)` outputs from 2 inputs."""
    width = losses.mixture_width(k, d, covariance)
    rng = np.random.default_rng(seed)
    op = NumpyLinearOp(FACTORY, seed=0, in_size=2, out_size=width)
    op.model = op.model.replace(
        W=(0.5 * rng.normal(size=(2, width))).astype(np.float32),
        b=(0.5 * rng.normal(size=width)).astype(np.float32),
    )
    return op


def normalizer() -> Normalizer:
    return Normalizer({"x": [1.0, -2.0], "y": [100.0, -0.5]}, {"x": [2.0, 0.5], "y": [10.0, 0.01]})


def two_component() -> Mixture:
    tril = np.array([[[0.5, 0.0], [0.3, 0.2]], [[1.0, 0.0], [-0.4, 0.6]]])
    return Mixture(np.array([0.3, 0.7]), np.array([[-2.0, 1.0], [3.0, 0.0]]), tril)


def test_mixture_samples_have_the_mixture_moments_and_weights() -> None:
    mix = two_component()
    assert mix.n_components == 2 and mix.dim == 2
    np.testing.assert_allclose(mix.mean, 0.3 * np.array([-2.0, 1.0]) + 0.7 * np.array([3.0, 0.0]))
    draws = mix.sample(np.random.default_rng(0), n=200_000)
    assert draws.shape == (200_000, 2)
    np.testing.assert_allclose(draws.mean(0), mix.mean, atol=0.02)
    # the mixture covariance: sum_k w_k (S_k + mu_k mu_k^T) - mu mu^T
    second = np.einsum("k,kij->ij", mix.weights, mix.covariances + np.einsum(
        "ki,kj->kij", mix.means, mix.means))  # fmt: skip
    expected_cov = second - np.outer(mix.mean, mix.mean)
    np.testing.assert_allclose(np.cov(draws.T), expected_cov, atol=0.03)
    # the share of draws nearer the first component is its weight (the modes are far apart)
    near_first = np.linalg.norm(draws - [-2.0, 1.0], axis=1) < np.linalg.norm(
        draws - [3.0, 0.0], axis=1
    )
    assert near_first.mean() == pytest.approx(0.3, abs=0.01)


def test_mixture_log_prob_is_a_normalised_density() -> None:
    mix = two_component()
    grid = np.linspace(-8.0, 8.0, 401)
    xx, yy = np.meshgrid(grid, grid, indexing="ij")
    points = np.stack([xx, yy], axis=-1)  # (401, 401, 2), broadcast against the batch ()
    density = np.exp(mix.log_prob(points))
    cell = (grid[1] - grid[0]) ** 2
    assert density.sum() * cell == pytest.approx(1.0, abs=1e-4)
    # a sample's log-density under the batch's mixtures: (n, *batch)
    batch = Mixture(
        np.tile(mix.weights, (4, 1)),
        np.tile(mix.means, (4, 1, 1)),
        np.tile(mix.scale_tril, (4, 1, 1, 1)),
    )
    draws = batch.sample(np.random.default_rng(1), n=5)
    assert draws.shape == (5, 4, 2) and batch.log_prob(draws).shape == (5, 4)
    np.testing.assert_allclose(batch.log_prob(draws)[:, 0], mix.log_prob(draws[:, 0]))
    with pytest.raises(
        ConfigError, match=r"2 values on its last axis. Received: value.shape=\(3,\)"
    ):
        mix.log_prob(np.zeros(3))
    with pytest.raises(ConfigError, match="Received: weights.shape"):
        Mixture(np.ones(3) / 3, np.zeros((2, 2)), np.zeros((2, 2, 2)))


@pytest.mark.parametrize("covariance", ["diag", "full"])
def test_decoded_output_scores_like_the_training_loss(covariance: str) -> None:
    rng = np.random.default_rng(2)
    out = rng.normal(size=(6, losses.mixture_width(3, 2, covariance)))
    y = rng.normal(size=(6, 2))
    mix = Mixture.from_output(out, 3, covariance)
    expected = losses.mixture_log_prob(out, y, n_components=3, covariance=covariance)
    np.testing.assert_allclose(mix.log_prob(y), expected, rtol=1e-12)
    np.testing.assert_allclose(mix.weights.sum(-1), 1.0)
    with pytest.raises(
        ConfigError, match=r"output width must be.*Received: output shape \(6, 14\)"
    ):
        Mixture.from_output(out[:, :14], 3, covariance)


@pytest.mark.parametrize("covariance", ["diag", "full"])
def test_mixture_head_is_in_original_units(covariance: str) -> None:
    op, norm = mixture_op(covariance=covariance), normalizer()
    forward = NeuralForward(
        op, normalizer=norm, head="mixture", n_components=3, covariance=covariance
    )
    states = np.array([[1.0, -2.0], [3.0, 0.0], [-1.0, -2.5]], dtype=np.float32)
    mix = forward.distribution(states)
    assert isinstance(mix, Mixture) and mix.means.shape == (3, 3, 2)

    raw = Mixture.from_output(op(norm.apply({"x": states})["x"]), 3, covariance)
    scale, offset = np.array([10.0, 0.01]), np.array([100.0, -0.5])
    np.testing.assert_allclose(mix.weights, raw.weights, rtol=1e-12)
    np.testing.assert_allclose(mix.means, raw.means * scale + offset, rtol=1e-6)
    # the density of y in original units is the normalised density over the Jacobian
    y = np.array([[101.0, -0.49], [95.0, -0.52], [110.0, -0.5]])
    expected = raw.log_prob((y - offset) / scale) - np.log(scale).sum()
    np.testing.assert_allclose(mix.log_prob(y), expected, rtol=1e-9)
    # samples, mean and the call agree in original units
    np.testing.assert_allclose(forward(states), mix.mean)
    draws = mix.sample(np.random.default_rng(0), n=100_000)
    standard_error = draws.std(0) / np.sqrt(len(draws))
    assert np.all(np.abs(draws.mean(0) - mix.mean) < 5 * standard_error)
    single = forward.distribution(states[1])
    np.testing.assert_allclose(single.means, mix.means[1])
    # residual: the components move by the state
    res = NeuralForward(op, residual=True, head="mixture", n_components=3, covariance=covariance)
    plain = NeuralForward(op, head="mixture", n_components=3, covariance=covariance)
    np.testing.assert_allclose(
        res.distribution(states).means, plain.distribution(states).means + states[:, None, :]
    )


def test_mixture_head_validation() -> None:
    with pytest.raises(ConfigError, match=r"Received: n_components=None. Pass n_components=K"):
        NeuralForward(mixture_op(), head="mixture")
    with pytest.raises(ConfigError, match=r"only for head='mixture'. Received: n_components=3"):
        NeuralForward(mixture_op(), head="gaussian", n_components=3)
    with pytest.raises(ConfigError, match=r"Received: covariance='tied'"):
        NeuralForward(mixture_op(), head="mixture", n_components=3, covariance="tied")
    wrong = NeuralForward(
        mixture_op(k=3), head="mixture", n_components=4
    )  # 15 outputs, not 4k(1+2d)
    with pytest.raises(ConfigError, match=r"n_components=4.*Received: output shape \(1, 15\)"):
        wrong(np.zeros(2))
    config = NeuralForward(mixture_op(), head="mixture", n_components=3).get_config()
    assert config["head"] == "mixture"
    assert config["head_options"] == {"n_components": 3, "covariance": "diag"}


def test_mixture_head_travels_through_the_registry(tmp_path: Path) -> None:
    op, norm = mixture_op(covariance="full"), normalizer()
    registry = LocalModelRegistry(tmp_path / "models")
    with pytest.raises(ConfigError, match=r"head='mixture' needs `head_options`"):
        registry.register("posterior", op, normalizer=norm, head="mixture")
    with pytest.raises(ConfigError, match=r"only for head='mixture'"):
        registry.register("posterior", op, head="gaussian", head_options={"n_components": 3})
    with pytest.raises(ConfigError, match=r"needs a `head`"):
        registry.register("posterior", op, head_options={"n_components": 3})
    assert registry.versions("posterior") == []  # nothing written
    options = {"n_components": 3, "covariance": "full"}
    record = registry.register(
        "posterior", op, normalizer=norm, head="mixture", head_options=options
    )
    assert record.head == "mixture" and record.head_options == options

    loaded_record, loaded = registry.load_record_and_model("posterior")
    assert loaded_record.head_options == options
    forward = NeuralForward.from_record(loaded_record, loaded)
    assert forward.head == "mixture" and forward.head_options == options
    states = np.array([[0.5, -1.0], [2.0, -2.0]], dtype=np.float32)
    expected = NeuralForward(op, normalizer=norm, head="mixture", **options).distribution(states)
    got = forward.distribution(states)
    for field in ("weights", "means", "scale_tril"):
        np.testing.assert_array_equal(getattr(got, field), getattr(expected, field))

    # the head options are covered by the record digest
    path = tmp_path / "models/posterior/1/manifest.json"
    manifest = json.loads(path.read_text())
    assert manifest["head_options"] == options
    manifest["head_options"] = {"n_components": 3, "covariance": "diag"}
    path.write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError, match="does not match its digest"):
        registry.load("posterior")
