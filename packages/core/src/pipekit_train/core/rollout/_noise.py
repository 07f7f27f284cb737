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

The *member noise* of ensemble training (a loss such as `crps(members=M, noise_dim=w)`)
is drawn the same way, from its own stream: `batch["member_noise"]` holds, for every
sample, member and unrolled step, `w` channels of standard normal noise per grid point,
`(B, M, k, *spatial, w)`, a pure function of `(plan seed, global batch index)`.
Validation batches get theirs from a third stream keyed by the batch's index within the
validation pass, so every validation scores the same members.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

__all__ = [
    "MEMBER_NOISE_KEY",
    "NOISE_KEY",
    "member_noise",
    "member_shape",
    "rollout_noise",
    "with_validation_members",
]

#: The batch key of the rollout's input noise (read by the backends' rollout loss only).
NOISE_KEY = "noise"

#: The batch key of ensemble training's member noise (read by the backends' rollout loss).
MEMBER_NOISE_KEY = "member_noise"

_TAG = 0x524F4C4C  # "ROLL": keeps this stream apart from other draws of the same seed
_MEMBER_TAGS = {"train": 0x4D454D42, "validation": 0x4D454D56}  # "MEMB", "MEMV"


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


def member_noise(
    seed: int,
    index: int,
    shape: tuple[int, ...],
    *,
    dtype: Any = np.float32,
    shard: tuple[int, int] = (0, 1),
    stream: str = "train",
) -> np.ndarray:
    """The member noise of batch `index`: this shard's rows of it.

    Args:
        seed: the plan's seed.
        index: the global batch index (training) or the batch's index within the
            validation pass (`stream="validation"`).
        shape: `(rows, M, k, *spatial, w)`: this shard's samples, the members, the
            unrolled steps, the grid and the noise channels.
        dtype: the dtype of the result (`x`'s).
        shard: `(index, count)` of this process (as for `rollout_noise`).
        stream: `"train"` or `"validation"`.

    Returns:
        Standard normal draws of `shape` from `Philox(key=(seed, index))` on the stream's tag.

    Examples:
        >>> import numpy as np
        >>> from pipekit_train.core.rollout import member_noise
        >>> whole = member_noise(0, 3, (4, 2, 1, 5))
        >>> half = member_noise(0, 3, (2, 2, 1, 5), shard=(1, 2))
        >>> bool(np.array_equal(whole[2:], half))
        True
    """
    rows = int(shape[0])
    part, count = shard
    tag = _MEMBER_TAGS[stream]
    key = np.array([(int(seed) ^ (tag << 32)) % 2**64, int(index)], dtype=np.uint64)
    gen = np.random.Generator(np.random.Philox(key=key))
    whole = gen.standard_normal((rows * count, *shape[1:]))
    return whole[part * rows : (part + 1) * rows].astype(dtype)


def member_shape(x_shape: tuple[int, ...], members: tuple[int, int, int]) -> tuple[int, ...]:
    """The member noise's shape for a batch `x` of `x_shape` and `(M, k, noise_dim)`."""
    m, k, w = members
    return (int(x_shape[0]), m, k, *x_shape[1:-1], w)


def with_validation_members(
    batches: Iterable[Mapping[str, Any]], *, seed: int, members: tuple[int, int, int]
) -> Iterator[dict[str, np.ndarray]]:
    """One validation pass whose batches carry member noise: batch `i` of the pass gets
    `member_noise(seed, i, ..., stream="validation")`, so every validation (and a resumed
    run's) scores the same members."""
    for i, batch in enumerate(batches):
        out = dict(batch)
        x = np.asarray(out["x"])
        out[MEMBER_NOISE_KEY] = member_noise(
            seed, i, member_shape(x.shape, members), dtype=x.dtype, stream="validation"
        )
        yield out
