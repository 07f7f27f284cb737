"""`NoisyBatches`: the training feed of a run with rollout input noise.

The noise itself is defined in `pipekit_train.core.rollout` (`rollout_noise`): a pure
function of `(plan seed, global batch index)`. This wrapper counts the global batches
from the run's start (`resumed step * accumulate_grad_batches`) and attaches
`batch["noise"]` to each training batch; validation batches never pass through it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from pipekit_train.core.rollout._noise import NOISE_KEY, rollout_noise

__all__ = ["NoisyBatches"]


class NoisyBatches:
    """A training batch iterator whose batches carry the rollout's input noise.

    Args:
        inner: the batch iterator (numpy batch dicts with `"x"`); its other attributes
            (`get_state`, `steps_per_epoch`, ...) pass through.
        std: `Rollout.noise_std` (> 0).
        seed: the plan's seed.
        start: the global index of the next batch (`resumed step * accumulate`).
        shard: `(index, count)` of this process.
    """

    def __init__(
        self, inner: Any, *, std: float, seed: int, start: int, shard: tuple[int, int] = (0, 1)
    ):
        self._inner = inner
        self._std = float(std)
        self._seed = int(seed)
        self._next = int(start)
        self._shard = (int(shard[0]), int(shard[1]))

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = dict(next(self._inner))
        x = np.asarray(batch["x"])
        batch[NOISE_KEY] = rollout_noise(
            self._seed, self._next, x.shape, self._std, dtype=x.dtype, shard=self._shard
        )
        self._next += 1
        return batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
