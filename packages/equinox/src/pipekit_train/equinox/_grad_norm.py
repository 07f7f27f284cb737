"""The `grad_norm` metric of an Equinox step (`TrainingLoop(log_grad_norm=True)`).

Core defines the value once (`pipekit_train.core.adapter.global_grad_norm`): the global
norm of the gradient the update applies, before clipping. Computed inside the compiled
step, so it costs no host transfer of its own.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array

from pipekit_train.core.adapter import GRAD_NORM, global_grad_norm

__all__ = ["GRAD_NORM", "grad_norm"]


def grad_norm(grads: Any, opt_state: Any, *, accumulate: int = 1) -> Array:
    """The global norm of the gradient the update uses (before clipping), as float32.

    Args:
        grads: this batch's gradient (unscaled).
        opt_state: the optimizer state before the step.
        accumulate: batches per update. Above 1 (an `optax.MultiSteps` state) each batch
            reports the norm of the running mean of its update's gradients, as the
            update computes it: the update's last batch holds the norm of the gradient
            the update applies, the value core records.
    """
    if accumulate > 1 and hasattr(opt_state, "acc_grads"):
        # optax.MultiSteps's running mean, as its update computes it
        n = opt_state.mini_step
        grads = jax.tree.map(lambda g, acc: acc + (g - acc) / (n + 1), grads, opt_state.acc_grads)
    return jnp.asarray(global_grad_norm(jax.tree.leaves(grads)), jnp.float32)
