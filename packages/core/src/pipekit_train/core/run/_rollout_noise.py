"""`NoisyBatches`: the training feed of a run with rollout input noise or member noise.

The noise itself is defined in `pipekit_train.core.rollout` (`rollout_noise`): a pure
function of `(plan seed, global batch index)`. This wrapper counts the global batches
from the run's start (`resumed step * accumulate_grad_batches`) and attaches
`batch["noise"]` (input noise) and `batch["member_noise"]` (ensemble training's, see
`member_noise`) to each training batch. Validation batches get their member noise from
`with_validation_members` (a stream of their own, the same at every validation).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from pipekit_train.core.rollout._noise import (
    MEMBER_NOISE_KEY,
    NOISE_KEY,
    member_noise,
    member_shape,
    rollout_noise,
    with_validation_members,
)

__all__ = ["NoisyBatches", "plan_members", "with_validation_members"]


def plan_members(plan: Any) -> tuple[int, int, int] | None:
    """`(M, k, noise_dim)` of a plan trained with an ensemble loss (`k`: the longest
    rollout), else None."""
    from pipekit_train.core.losses._ensemble import ensemble_params

    rollout = getattr(plan, "rollout", None)
    describe = getattr(plan.loss, "describe", None)
    if rollout is None or not callable(describe):
        return None
    params = ensemble_params(describe())
    if params is None:
        return None
    return params[0], int(rollout.max_steps), params[1]


class NoisyBatches:
    """A training batch iterator whose batches carry the rollout's input noise.

    Args:
        inner: the batch iterator (numpy batch dicts with `"x"`); its other attributes
            (`get_state`, `steps_per_epoch`, ...) pass through.
        std: `Rollout.noise_std` (0: no input noise).
        seed: the plan's seed.
        start: the global index of the next batch (`resumed step * accumulate`).
        shard: `(index, count)` of this process.
        members: `(M, k, noise_dim)` of an ensemble loss (None: no member noise).
    """

    def __init__(
        self,
        inner: Any,
        *,
        std: float,
        seed: int,
        start: int,
        shard: tuple[int, int] = (0, 1),
        members: tuple[int, int, int] | None = None,
    ):
        self._inner = inner
        self._members = members
        self._std = float(std)
        self._seed = int(seed)
        self._next = int(start)
        self._shard = (int(shard[0]), int(shard[1]))

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = dict(next(self._inner))
        x = np.asarray(batch["x"])
        if self._std > 0:
            batch[NOISE_KEY] = rollout_noise(
                self._seed, self._next, x.shape, self._std, dtype=x.dtype, shard=self._shard
            )
        if self._members is not None:
            batch[MEMBER_NOISE_KEY] = member_noise(
                self._seed,
                self._next,
                member_shape(x.shape, self._members),
                dtype=x.dtype,
                shard=self._shard,
            )
        self._next += 1
        return batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
