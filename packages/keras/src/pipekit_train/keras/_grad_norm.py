"""The `grad_norm` metric on Keras (`TrainingLoop(log_grad_norm=True)`), jax and torch.

Keras's optimizer calls `_clip_gradients(grads)` once per optimizer update with the
gradient the update applies: after a loss scale is undone and, with
`gradient_accumulation_steps`, the mean of the accumulated batches, before
`global_clipnorm` / `clipvalue`. `install_grad_norm` wraps that method on the compiled
model's optimizer: it computes `grad_norm` (core's `global_grad_norm`) of those
gradients and writes it into a ring buffer held in an optimizer variable, followed by an
update count (like the `StepLossTracker`'s losses), so it lives in Keras's stateless jax
state and the fused steps of `steps_per_execution=K` each keep their own value. On jax,
Keras's accumulation path calls the method on every batch but keeps optimizer variables
only on the update's last batch, so the count advances once per update on both backends.

The variable is left out of checkpoints (`TrainState.variables`); a run starts with it
zeroed (`reset`). This module imports keras.
"""

from __future__ import annotations

from typing import Any

from keras import ops
from pipekit_train.core.adapter import global_grad_norm

from ._tracker import COUNT_MODULUS

__all__ = ["NORMS_NAME", "GradNormBuffer", "grad_norm", "install_grad_norm"]

NORMS_NAME = "pipekit_grad_norms"


def grad_norm(grads: Any) -> Any:
    """Core's `global_grad_norm` of an update's gradients (None entries skipped), float32."""
    return ops.cast(global_grad_norm([g for g in grads if g is not None]), "float32")


class GradNormBuffer:
    """The optimizer variable holding the last `capacity` update norms and their count.

    Args:
        variable: the `(capacity + 1,)` float32 optimizer variable.
        capacity: the ring buffer size (the most updates between two reads).
    """

    def __init__(self, variable: Any, capacity: int):
        self.variable = variable
        self.capacity = int(capacity)

    def reset(self) -> None:
        """Zero the buffer and the count (before a fit starts)."""
        self.variable.assign(ops.zeros(self.variable.shape, "float32"))

    def record(self, grads: Any) -> None:
        """Write the global norm of `grads` into the next slot (traced inside Keras's step)."""
        norm = grad_norm(grads)
        packed = self.variable.value
        cap = self.capacity
        count = packed[cap]
        slot = ops.equal(ops.arange(cap, dtype="float32"), ops.mod(count, float(cap)))
        ring = ops.where(slot, norm, packed[:cap])
        step = ops.reshape(ops.mod(count + 1.0, float(COUNT_MODULUS)), (1,))
        self.variable.assign(ops.concatenate([ring, step]))


def install_grad_norm(optimizer: Any, capacity: int) -> GradNormBuffer:
    """Add the norm buffer to a built optimizer and wrap its `_clip_gradients`.

    With a `LossScaleOptimizer` (float16) the wrapped one is the inner optimizer, which
    sees unscaled gradients.
    """
    target = getattr(optimizer, "inner_optimizer", optimizer)
    variable = target.add_variable(
        (int(capacity) + 1,), initializer="zeros", dtype="float32", name=NORMS_NAME
    )
    buffer = GradNormBuffer(variable, capacity)
    clip = target._clip_gradients

    def _clip_gradients(grads: Any) -> Any:
        buffer.record(grads)
        return clip(grads)

    target._clip_gradients = _clip_gradients
    return buffer
