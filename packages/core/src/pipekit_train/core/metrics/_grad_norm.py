"""The `grad_norm` training metric: one definition, computed by every backend's step.

With `TrainingLoop(log_grad_norm=True)` every optimizer update records `grad_norm`, the
global L2 norm of the gradient the update uses, *before* clipping (`clip_norm`,
`clip_value`) and after loss scaling is undone (mixed precision):

    grad_norm = sqrt(sum over every trainable array g of sum(g * g))

With gradient accumulation (`accumulate_grad_batches=k`) it is the norm of the
accumulated gradient, the mean of the `k` batches' gradients, once per update (not the
mean of `k` per-batch norms). It goes to the history and the writers like the loss, one
value per step (fused steps included). Off by default: it costs a reduction over every
gradient each step.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import numpy as np

__all__ = ["GRAD_NORM", "global_grad_norm", "reduce_micro"]

GRAD_NORM: Final = "grad_norm"
"""The metric's name in the history and the writers."""


CONCAT_LIMIT: Final = 1 << 22
"""Up to this many gradient elements in all, `global_grad_norm` reduces one flat copy."""


def global_grad_norm(grads: Iterable[Any]) -> Any:
    """The global L2 norm of gradient arrays (numpy, jax, torch: any array-API array).

    `None` entries (parameters without a gradient) are skipped. The sum runs in float32
    (or the arrays' own dtype if wider), and the result is a 0-d array of the arrays'
    namespace, so it stays on the device.

    Up to `CONCAT_LIMIT` elements in all (16 MiB of float32), the arrays are flattened
    into one vector and reduced once, so a compiled step runs one reduction instead of
    one per array (a few microseconds less per step on XLA's CPU backend; what the
    metric still costs there is measured in `docs/training-spec.md`). Larger gradients
    are reduced array by array, so the norm never holds a second copy of a large
    model's gradient.

    Args:
        grads: the gradient arrays (the leaves of the gradient tree).

    Returns:
        `sqrt(sum(sum(g * g) for g in grads))`.

    Raises:
        ValueError: no gradient array was given.
    """
    from array_api_compat import array_namespace, size

    arrays = [g for g in grads if g is not None]
    if not arrays:
        raise ValueError("global_grad_norm() needs at least one gradient array. Received: none.")
    xp = array_namespace(*arrays)
    wide = [g if xp.finfo(g.dtype).bits >= 32 else xp.astype(g, xp.float32) for g in arrays]
    if sum(int(size(g) or 0) for g in wide) <= CONCAT_LIMIT:
        flat = xp.concat([xp.reshape(g, (-1,)) for g in wide])
        return xp.sqrt(xp.sum(flat * flat))
    total = None
    for g in wide:
        part = xp.sum(g * g)
        total = part if total is None else total + part
    return xp.sqrt(total)


def reduce_micro(name: str, values: np.ndarray, count: int, micro: int) -> np.ndarray:
    """One value per step from a metric's values of `count` fused steps.

    A metric with one value per accumulated batch (`count * micro` values) becomes the
    mean over each step's batches (the loss), except `grad_norm`, whose value of a step
    is its last batch's: the norm of the whole accumulated gradient. A metric with one
    value per step (`count` values) is taken as it is.
    """
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    if flat.size == count:
        return flat
    per_batch = flat.reshape(count, micro)
    return per_batch[:, -1] if name == GRAD_NORM else per_batch.mean(axis=1)
