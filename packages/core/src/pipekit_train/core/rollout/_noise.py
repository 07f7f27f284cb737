"""The input noise of rollout training, drawn once in core for every backend.

`TrainingLoop(rollout=Rollout(noise_std=s))` adds Gaussian noise to the first state of
every training window. The noise is part of the data stream, not of a backend's step:
the run's feed (`run/_rollout_noise.py`) attaches `batch["noise"]` (of `x`'s shape and
dtype, already scaled by `s`, in normalised units of the state) to every training batch,
so every backend trains on the same noise and a golden run can compare them.

The noise of a batch is a pure function of `(plan seed, global batch index)`: a
counter-based generator (`numpy.random.Philox`) keyed by both draws it. A resumed run
(positioned at `step * accumulate_grad_batches` batches) continues the stream exactly.
With data sharding each process draws the noise of the whole global batch and keeps its
own rows (the rows `make_batches` gives it), so a run resumed with another process count
draws the same noise for every sample.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["NOISE_KEY", "rollout_noise"]

#: The batch key of the rollout's input noise (read by the backends' rollout loss only).
NOISE_KEY = "noise"

_TAG = 0x524F4C4C  # "ROLL": keeps this stream apart from other draws of the same seed


def rollout_noise(
    seed: int,
    index: int,
    shape: tuple[int, ...],
    std: float,
    *,
    dtype: Any = np.float32,
    shard: tuple[int, int] = (0, 1),
) -> np.ndarray:
    """The input noise of global batch `index`: this shard's rows of it.

    Args:
        seed: the plan's seed.
        index: the global batch index (0 for the first batch of the run).
        shape: the shape of this shard's `x` (rows first).
        std: the noise's standard deviation (`Rollout.noise_std`).
        dtype: the dtype of the result (`x`'s).
        shard: `(index, count)` of this process; its rows are part `index` of `count`
            equal parts of the global batch.

    Returns:
        `std * N(0, 1)` of `shape`, drawn from `Philox(key=(seed, index))`.

    Examples:
        >>> import numpy as np
        >>> from pipekit_train.core.rollout import rollout_noise
        >>> whole = rollout_noise(0, 5, (4, 3), 0.1)
        >>> half = rollout_noise(0, 5, (2, 3), 0.1, shard=(1, 2))
        >>> bool(np.array_equal(whole[2:], half))
        True
    """
    rows = int(shape[0])
    part, count = shard
    key = np.array([(int(seed) ^ (_TAG << 32)) % 2**64, int(index)], dtype=np.uint64)
    gen = np.random.Generator(np.random.Philox(key=key))
    whole = gen.standard_normal((rows * count, *shape[1:]))
    return (float(std) * whole[part * rows : (part + 1) * rows]).astype(dtype)
