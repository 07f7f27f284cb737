"""`LikelihoodPosterior`: a trained likelihood (NLE) and a prior, read as a posterior.

*Neural likelihood estimation* trains a distribution head (a flow, a mixture, a
Gaussian) on `x` given `θ`: the network's input is the parameters and its target the
simulated data. `artifact.posterior()` of that run is then a likelihood, `q(x | θ)`:
its `distribution(θ)` is a density over `x`. `LikelihoodPosterior` multiplies it with a
prior and draws the posterior `p(θ | x_o) ∝ prior(θ) · q(x_o | θ)` by sequential Monte
Carlo (`smc_sample`).

**I.i.d. points.** When an observation is a set of points drawn independently given θ
(sbibm's slcp: four 2-D points), the network can learn one point's density `q(x_i | θ)`
from every point of every simulation, and the observation's likelihood is the product
over its points. Pass `point_size` (the values of one point) and train on the points.

`BoxPrior` is the uniform prior on a box, the prior of most simulation-based inference
benchmarks; any object with `sample(rng, m)` and `log_prob(θ)` works too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pipekit_train.core._checks import positive_int
from pipekit_train.core._errors import ConfigError

from ._smc import check_prior, smc_sample

__all__ = ["BoxPrior", "LikelihoodPosterior"]


class BoxPrior:
    """The uniform prior on the box `[low, high]` (`d` values).

    Args:
        low: the lower corner, `d` values.
        high: the upper corner, `d` values, each above `low`'s.
    """

    def __init__(self, low: Any, high: Any):
        lo = np.atleast_1d(np.asarray(low, dtype=np.float64))
        hi = np.atleast_1d(np.asarray(high, dtype=np.float64))
        if lo.ndim != 1 or lo.shape != hi.shape or not np.all(np.isfinite(lo) & np.isfinite(hi)):
            raise ConfigError(
                "`low` and `high` must be finite and of one shape (d,). Received: "
                f"low={np.asarray(low).tolist()}, high={np.asarray(high).tolist()}."
            )
        if not np.all(lo < high):
            raise ConfigError(
                f"`low` must be below `high` in every value. Received: low={lo.tolist()}, "
                f"high={hi.tolist()}."
            )
        self.low, self.high = lo, hi
        self._log_density = -float(np.sum(np.log(hi - lo)))

    @property
    def dim(self) -> int:
        """The number of parameters."""
        return len(self.low)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`(n, d)` uniform draws."""
        return rng.uniform(self.low, self.high, size=(int(n), self.dim))

    def log_prob(self, theta: Any) -> np.ndarray:
        """`-log(volume)` inside the box, `-inf` outside; shape `theta.shape[:-1]`."""
        t = np.asarray(theta, dtype=np.float64)
        inside = np.all((t >= self.low) & (t <= self.high), axis=-1)
        return np.where(inside, self._log_density, -np.inf)

    def __repr__(self) -> str:
        return f"BoxPrior(low={self.low.tolist()}, high={self.high.tolist()})"


class LikelihoodPosterior:
    """A likelihood network and a prior: `log_likelihood(x)` and posterior draws.

    ```python
    artifact = TrainingLoop(model=..., data=ArrayDataset(x=theta, y=x), loss=losses.flow_nll(),
                            normalizer=Normalizer.fit(data, keys=("x", "y")), ...).run()
    posterior = LikelihoodPosterior(artifact.posterior(), BoxPrior(low, high))
    draws = posterior.sample(x_o, 10_000, seed=0)
    ```

    Args:
        likelihood: the trained likelihood: an object whose `distribution(θ)` for a batch
            of parameters `(m, d)` is a batch of densities over `x` (`artifact.posterior()`
            of a run trained on `x` given `θ`; a `NeuralForward`; a `PosteriorEnsemble`).
        prior: the prior, with `sample(rng, m)` and `log_prob(θ)` (e.g. `BoxPrior`).
        point_size: the values of one i.i.d. point when the network learned one point's
            density; an observation is then read as `(-1, point_size)` points and its
            log-likelihood is the sum over them. None: the network learned all of `x`.
        batch_size: parameter rows evaluated per network call.
    """

    def __init__(
        self,
        likelihood: Any,
        prior: Any,
        *,
        point_size: int | None = None,
        batch_size: int = 16_384,
    ):
        if not callable(getattr(likelihood, "distribution", None)):
            raise ConfigError(
                "`likelihood` must have `distribution(theta)` (e.g. artifact.posterior() of a "
                f"run trained on x given theta). Received: likelihood={likelihood!r}."
            )
        check_prior(prior)
        point_size = positive_int("point_size", point_size, allow_none=True)
        batch_size = positive_int("batch_size", batch_size)
        self.likelihood, self.prior = likelihood, prior
        self.point_size, self.batch_size = point_size, batch_size

    def _points(self, x: Any) -> np.ndarray:
        """The observation as `(points, size)`: its i.i.d. points, or one point of all x."""
        values = np.asarray(x, dtype=np.float64)
        if self.point_size is None:
            return values.reshape(1, *values.shape)
        if values.size % self.point_size:
            raise ConfigError(
                f"The observation must hold whole points of point_size={self.point_size} "
                f"values. Received: x of shape {values.shape} ({values.size} values)."
            )
        return values.reshape(-1, self.point_size)

    def log_likelihood(self, x: Any) -> Callable[[np.ndarray], np.ndarray]:
        """The estimated `log q(x | θ)` as a function of a batch of θ `(m, d) -> (m,)`
        (summed over the points with `point_size`)."""
        points = self._points(x)

        def log_q(theta: np.ndarray) -> np.ndarray:
            parts = []
            for i in range(0, len(theta), self.batch_size):
                rows = np.asarray(theta[i : i + self.batch_size], dtype=np.float32)
                dist = self.likelihood.distribution(rows)  # batch (rows,)
                lp = np.asarray(dist.log_prob(points[:, None]), dtype=np.float64)
                # over the points (and the values, for an element-wise `Gaussian`)
                parts.append(lp.reshape(len(points), len(rows), -1).sum(axis=(0, 2)))
            return np.concatenate(parts) if parts else np.zeros(0)

        return log_q

    def sample(self, x: Any, n: int, *, seed: int = 0, **smc_options: Any) -> np.ndarray:
        """`n` draws of the posterior at the observation `x`, `(n, d)`, by `smc_sample`.

        Args:
            x: one observation (as the network's targets were shaped; with `point_size`,
                its points one after the other).
            n: the draws.
            seed: seeds the sampler.
            **smc_options: `ess`, `moves`, `final_moves`, `clusters`, `info` of
                `smc_sample`.
        """
        return smc_sample(self.log_likelihood(x), self.prior, n, seed=seed, **smc_options)

    def __repr__(self) -> str:
        points = "" if self.point_size is None else f", point_size={self.point_size}"
        return f"LikelihoodPosterior({self.likelihood!r}, {self.prior!r}{points})"
