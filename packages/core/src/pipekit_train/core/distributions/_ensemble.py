"""`Ensemble`: several trained networks' distributions read as one.

Networks trained on the same simulations from different seeds make different errors; their
equal-weight mixture is a common way to get a better and less over-confident amortized
posterior (`sbi`'s `NeuralPosteriorEnsemble`, BayesFlow's ensembles). Here the mixture is
formed from what each network already predicts (`Gaussian`, `Mixture`, `Flow`, or anything
with `sample(rng, n)` and `log_prob(value)`), in numpy, so it is the same for every backend
and needs no weights of its own. `PosteriorEnsemble` (`pipekit_train.core.rollout`, beside
`NeuralForward`) reads several trained posteriors as one and returns an `Ensemble` per
observation:

```python
posteriors = [artifact.posterior(state_ndim=2) for artifact in artifacts]
ensemble = PosteriorEnsemble(posteriors)
dist = ensemble.distribution(x_o).within(low, high)   # the mixture truncated to the box
draws = dist.sample(np.random.default_rng(0), 10_000)
```
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError

__all__ = ["Ensemble", "member_weights"]


def member_weights(weights: Any, k: int) -> np.ndarray:
    """The members' weights `(K, ...)`, normalised over the members (default: equal)."""
    if weights is None:
        return np.full(k, 1.0 / k)
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim < 1 or w.shape[0] != k or not np.all(np.isfinite(w)) or not np.all(w >= 0):
        raise ConfigError(
            f"`weights` must hold one finite, non-negative weight per member ({k}) on its "
            f"first axis. Received: weights={np.asarray(weights).tolist()!r}."
        )
    total = w.sum(axis=0)
    if not np.all(total > 0):
        raise ConfigError(
            f"`weights` must not be all zero. Received: weights={w.tolist()!r}. Leave "
            "weights=None for an equal-weight ensemble."
        )
    return w / total


def _joint_log_prob(dist: Any, value: np.ndarray) -> np.ndarray:
    """One log-density per point: a `Gaussian`'s per-element densities are summed over the
    values (as is any member's whose `log_prob` has the value's own shape)."""
    from ._gaussian import Gaussian

    lp = np.asarray(dist.log_prob(value), dtype=np.float64)
    if isinstance(dist, Gaussian) or lp.shape == value.shape:
        lp = lp.sum(axis=-1)
    return lp


def _align(weights: np.ndarray, ndim: int) -> np.ndarray:
    """`weights` `(K, *batch)` shaped to broadcast against `(K, *lead, *batch)` of `1 + ndim`
    axes (the batch axes are the trailing ones)."""
    k, batch = weights.shape[0], weights.shape[1:]
    return weights.reshape(k, *([1] * (ndim - len(batch))), *batch)


def _logsumexp(a: np.ndarray, axis: int = 0) -> np.ndarray:
    top = np.max(a, axis=axis, keepdims=True)
    safe = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(a - safe), axis=axis, keepdims=True)) + safe
    return np.squeeze(out, axis=axis)


@dataclass(frozen=True, eq=False)
class Ensemble:
    """A mixture of the distributions several networks predict for the same observations.

    Member `k` is chosen with probability `weights[k]` (equal by default), then drawn
    from; the density is `sum_k weights[k] * p_k(value)`.

    Attributes:
        members: the members' distributions (each with `sample(rng, n)`; `log_prob`,
            `mean` and `within` when those are used), over the same batch of observations.
        weights: `(K,)` or, per observation, `(K, *batch)`; normalised over the members.
            None: equal weights.
        acceptance: the untruncated mixture's mass inside the box of `within`, per
            observation (1.0 without a box); set by `within`.
    """

    members: tuple[Any, ...]
    weights: np.ndarray | None = None
    acceptance: Any = 1.0

    def __post_init__(self) -> None:
        members = tuple(self.members)
        if not members or not all(callable(getattr(m, "sample", None)) for m in members):
            raise ConfigError(
                "`members` must be a non-empty sequence of distributions with `sample(rng, "
                f"n)` (Gaussian, Mixture, Flow). Received: members={self.members!r}."
            )
        object.__setattr__(self, "members", members)
        object.__setattr__(self, "weights", member_weights(self.weights, len(members)))
        object.__setattr__(self, "acceptance", np.asarray(self.acceptance, dtype=np.float64))

    def _choice(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        """A member index per position of `shape` (`(n, *batch)` or `batch`)."""
        assert self.weights is not None
        cum = np.cumsum(
            np.broadcast_to(_align(self.weights, len(shape)), (len(self.members), *shape)), axis=0
        )
        u = np.asarray(rng.random(shape))
        return np.minimum(np.sum(u[None] >= cum, axis=0), len(self.members) - 1)

    def sample(self, rng: np.random.Generator, n: int | None = None) -> np.ndarray:
        """Draw with `rng`: the members' sample shape, `(..., d)` or `(n, ..., d)`.

        Each member draws the full count and one member is kept per draw and observation:
        the cost is the members' together (K times one network's).
        """
        stacked = np.stack([np.asarray(m.sample(rng, n), dtype=np.float64) for m in self.members])
        which = self._choice(rng, stacked.shape[1:-1])
        return np.take_along_axis(stacked, which[None, ..., None], axis=0)[0]

    def log_prob(self, value: Any) -> np.ndarray:
        """The mixture's log-density of `value` `(..., d)`, one per point (a per-element
        member density, a `Gaussian`'s, is summed over the values first)."""
        assert self.weights is not None
        y = np.asarray(value, dtype=np.float64)
        lps = np.stack(np.broadcast_arrays(*[_joint_log_prob(m, y) for m in self.members]))
        with np.errstate(divide="ignore"):
            log_w = np.log(_align(self.weights, lps.ndim - 1))
        return _logsumexp(lps + log_w, axis=0)

    @property
    def mean(self) -> np.ndarray:
        """The mixture's mean, `sum_k weights[k] * mean_k`."""
        assert self.weights is not None
        means = np.stack([np.asarray(m.mean, dtype=np.float64) for m in self.members])
        return np.sum(_align(self.weights, means.ndim - 2)[..., None] * means, axis=0)

    def within(self, low: Any, high: Any) -> Ensemble:
        """The mixture truncated to the box `[low, high]`: every member truncated
        (`Flow.within`), re-weighted by its mass inside the box (`acceptance`), so that
        the result is the mixture's own restriction to the box, renormalised.

        Raises:
            ConfigError: a member has no `within` (only `Flow` has one).
        """
        assert self.weights is not None
        if not all(callable(getattr(m, "within", None)) for m in self.members):
            names = sorted({type(m).__name__ for m in self.members})
            raise ConfigError(
                f"`within` needs members with `within(low, high)` (a Flow). Received: members "
                f"of type {names}. Reject draws outside the box yourself for these heads."
            )
        boxed = [m.within(low, high) for m in self.members]
        inside = np.stack([np.asarray(b.acceptance, dtype=np.float64) for b in boxed])
        kept = _align(self.weights, inside.ndim - 1) * inside
        return Ensemble(tuple(boxed), kept, acceptance=self.acceptance * kept.sum(axis=0))

    def __getitem__(self, index: Any) -> Ensemble:
        """The distributions at `index` of the batch axes (numpy indexing)."""
        assert self.weights is not None
        weights = self.weights
        if weights.ndim > 1:
            weights = weights[(slice(None), *(index if isinstance(index, tuple) else (index,)))]
        acceptance = self.acceptance[index] if self.acceptance.ndim else self.acceptance
        return Ensemble(tuple(m[index] for m in self.members), weights, acceptance)

    def __len__(self) -> int:
        return len(self.members[0])
