"""`deep_set`: a permutation-invariant embedding for sets of i.i.d. points, on equinox.

The output must not depend on the order of a set's points (every ordering, exactly up to
float rounding), must depend on the points themselves, and the network must train end to
end with a posterior head: θ ~ N(0, I₂), ten points x_j ~ N(θ, I₂), whose exact posterior
is N(Σ x_j / 11, I / 11).
"""

from __future__ import annotations

import numpy as np
import pytest

from pipekit_train.core import ArrayDataset, ConfigError, Normalizer, TrainingLoop, losses
from pipekit_train.equinox import EquinoxModelOp

FACTORY = "pipekit_train.equinox:deep_set"
SIZES = {"point_size": 2, "out_size": 4, "width": 32, "embed_size": 16, "depth": 1}


def _op(**overrides: object) -> EquinoxModelOp:
    return EquinoxModelOp(FACTORY, **{**SIZES, "seed": 0, **overrides})


def _sets(n: int, seed: int, points: int = 10) -> ArrayDataset:
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=(n, 2))
    x = theta[:, None, :] + rng.normal(size=(n, points, 2))
    return ArrayDataset(x=x.astype(np.float32), y=theta.astype(np.float32))


@pytest.mark.parametrize("pooling", ["mean", "sum"])
def test_permuting_the_points_leaves_the_output_unchanged(pooling: str) -> None:
    op = _op(pooling=pooling)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 9, 2)).astype(np.float32)
    out = np.asarray(op(x))
    assert out.shape == (6, 4)
    for _ in range(3):
        perm = rng.permutation(9)
        np.testing.assert_allclose(np.asarray(op(x[:, perm])), out, rtol=1e-5, atol=1e-6)
    # not a constant: moving one point, or swapping a point's coordinates, changes it
    moved = x.copy()
    moved[:, 0] += 1.0
    assert np.abs(np.asarray(op(moved)) - out).max(axis=1).min() > 1e-4  # every set changes
    assert np.abs(np.asarray(op(np.ascontiguousarray(x[:, :, ::-1]))) - out).max() > 1e-3


def test_mean_pooling_ignores_the_set_size_and_sum_pooling_does_not() -> None:
    x = np.random.default_rng(1).normal(size=(4, 5, 2)).astype(np.float32)
    twice = np.concatenate([x, x], axis=1)  # every point twice: the same empirical measure
    mean_op, sum_op = _op(pooling="mean"), _op(pooling="sum")
    np.testing.assert_allclose(np.asarray(mean_op(twice)), np.asarray(mean_op(x)), atol=1e-5)
    assert np.abs(np.asarray(sum_op(twice)) - np.asarray(sum_op(x))).max() > 1e-3


def test_bad_options_are_refused() -> None:
    with pytest.raises(ConfigError, match="pooling='max'"):
        _op(pooling="max")
    with pytest.raises(ConfigError, match="point_size=0"):
        _op(point_size=0)
    with pytest.raises(ConfigError, match="activation='gelu'"):
        _op(activation="gelu")
    with pytest.raises(ValueError, match="3"):  # points of 3 values into point_size=2
        _op()(np.zeros((2, 5, 3), np.float32))


def test_deep_set_trains_end_to_end_with_a_gaussian_head() -> None:
    train, val = _sets(3000, 0), _sets(300, 1)
    loop = TrainingLoop(
        model=_op(),
        data=train,
        validation=val,
        loss=losses.gaussian_nll,
        normalizer=Normalizer.fit(train, keys=("y",)),  # x is not normalised per position
        optimizer_config={"name": "adam", "lr": 3e-3},
        batch_size=64,
        max_steps=400,
        progress=False,
        seed=0,
    )
    artifact = loop.run()
    dist = artifact.posterior(state_ndim=2).distribution(val.arrays["x"])
    exact_mean, exact_std = val.arrays["x"].sum(axis=1) / 11.0, (1.0 / 11.0) ** 0.5
    # before training the prediction knows nothing of x: its error is the prior's, 1.0
    assert np.sqrt(np.mean((dist.mean - exact_mean) ** 2)) < 0.1
    assert abs(float(np.mean(dist.std)) / exact_std - 1.0) < 0.15
    report = artifact.calibration(val, num_samples=100)
    assert report.coverage_hpd is not None and report.coverage_hpd.check(tolerance=0.05).passed


def test_deep_set_feeds_a_mixture_head_too() -> None:
    train = _sets(3000, 0)
    val = _sets(300, 1)
    loss = losses.mixture_nll(n_components=2, covariance="full")
    artifact = TrainingLoop(
        model=_op(out_size=losses.mixture_width(2, 2, "full")),
        data=train,
        loss=loss,
        normalizer=Normalizer.fit(train, keys=("y",)),
        optimizer_config={"name": "adam", "lr": 3e-3},
        batch_size=64,
        max_steps=400,
        progress=False,
        seed=0,
    ).run()
    dist = artifact.posterior(state_ndim=2).distribution(val.arrays["x"])
    assert dist.n_components == 2
    exact_mean = val.arrays["x"].sum(axis=1) / 11.0
    assert np.sqrt(np.mean((dist.mean - exact_mean) ** 2)) < 0.1
