"""The cross-backend checks of a `deep_set` embedding (each adapter package runs them).

A backend's test file subclasses `DeepSetSuite` and says how to build its `deep_set`
operator (`make_op`) and, where it is not the default, which adapter trains it. The
output must not depend on the order of a set's points (every ordering, exactly up to
float rounding), must depend on the points themselves, and the network must train end to
end with a posterior head: θ ~ N(0, I₂), ten points x_j ~ N(θ, I₂), whose exact posterior
is N(Σ x_j / 11, I / 11).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["DEEP_SET_SIZES", "DeepSetSuite", "point_sets"]

#: The sizes every backend's `deep_set` is checked at.
DEEP_SET_SIZES = {"point_size": 2, "out_size": 4, "width": 32, "embed_size": 16, "depth": 1}


def point_sets(n: int, seed: int, points: int = 10) -> Any:
    """`n` simulations of θ ~ N(0, I₂) and `points` points x_j ~ N(θ, I₂) (`ArrayDataset`)."""
    from pipekit_train.core.data import ArrayDataset

    rng = np.random.default_rng(seed)
    theta = rng.normal(size=(n, 2))
    x = theta[:, None, :] + rng.normal(size=(n, points, 2))
    return ArrayDataset(x=x.astype(np.float32), y=theta.astype(np.float32))


def _exact_mean(x: np.ndarray) -> np.ndarray:
    return x.sum(axis=1) / 11.0


class DeepSetSuite:
    """pytest checks of a backend's `deep_set` (subclass as `Test...`, set `make_op`).

    Attributes:
        adapter: the adapter that trains the embedding (None: the backend's default).
    """

    adapter: Any = None

    def make_op(self, **options: Any) -> Any:
        """The backend's `deep_set` model operator with these options."""
        raise NotImplementedError

    def op(self, **overrides: Any) -> Any:
        return self.make_op(**{**DEEP_SET_SIZES, "seed": 0, **overrides})

    def _train(self, loss: Any, out_size: int) -> Any:
        from pipekit_train.core import Normalizer, TrainingLoop

        train = point_sets(3000, 0)
        return TrainingLoop(
            model=self.op(out_size=out_size),
            data=train,
            validation=point_sets(300, 1),
            loss=loss,
            normalizer=Normalizer.fit(train, keys=("y",)),  # x is not normalised per position
            optimizer_config={"name": "adam", "lr": 3e-3},
            batch_size=64,
            max_steps=400,
            progress=False,
            seed=0,
            adapter=self.adapter,
        ).run()

    def test_permuting_the_points_leaves_the_output_unchanged(self) -> None:
        rng = np.random.default_rng(0)
        x = rng.normal(size=(6, 9, 2)).astype(np.float32)
        for pooling in ("mean", "sum"):
            op = self.op(pooling=pooling)
            out = np.asarray(op(x))
            assert out.shape == (6, 4)
            for _ in range(3):
                perm = rng.permutation(9)
                np.testing.assert_allclose(np.asarray(op(x[:, perm])), out, rtol=1e-5, atol=1e-6)
            # not a constant: moving one point, or swapping a point's coordinates, changes it
            moved = x.copy()
            moved[:, 0] += 1.0
            assert np.abs(np.asarray(op(moved)) - out).max(axis=1).min() > 1e-4
            swapped = np.ascontiguousarray(x[:, :, ::-1])
            assert np.abs(np.asarray(op(swapped)) - out).max() > 1e-3

    def test_mean_pooling_ignores_the_set_size_and_sum_pooling_does_not(self) -> None:
        x = np.random.default_rng(1).normal(size=(4, 5, 2)).astype(np.float32)
        twice = np.concatenate([x, x], axis=1)  # every point twice: the same empirical measure
        mean_op, sum_op = self.op(pooling="mean"), self.op(pooling="sum")
        np.testing.assert_allclose(np.asarray(mean_op(twice)), np.asarray(mean_op(x)), atol=1e-5)
        assert np.abs(np.asarray(sum_op(twice)) - np.asarray(sum_op(x))).max() > 1e-3

    def test_bad_options_are_refused(self) -> None:
        import pytest

        from pipekit_train.core import ConfigError

        with pytest.raises(ConfigError, match="pooling='max'"):
            self.op(pooling="max")
        with pytest.raises(ConfigError, match="point_size=0"):
            self.op(point_size=0)
        with pytest.raises(ConfigError, match="activation='gelu'"):
            self.op(activation="gelu")
        with pytest.raises(ValueError, match="3"):  # points of 3 values into point_size=2
            self.op()(np.zeros((2, 5, 3), np.float32))

    def test_deep_set_trains_end_to_end_with_a_gaussian_head(self) -> None:
        from pipekit_train.core import losses

        artifact = self._train(losses.gaussian_nll, 4)
        val = point_sets(300, 1)
        dist = artifact.posterior(state_ndim=2).distribution(val.arrays["x"])
        exact_std = (1.0 / 11.0) ** 0.5
        # before training the prediction knows nothing of x: its error is the prior's, 1.0
        assert np.sqrt(np.mean((dist.mean - _exact_mean(val.arrays["x"])) ** 2)) < 0.1
        assert abs(float(np.mean(dist.std)) / exact_std - 1.0) < 0.15
        report = artifact.calibration(val, num_samples=100)
        assert report.coverage_hpd is not None and report.coverage_hpd.check(tolerance=0.05).passed
