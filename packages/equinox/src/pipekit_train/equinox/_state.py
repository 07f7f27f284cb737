"""`TrainState`: everything one training step reads and writes."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import PRNGKeyArray, PyTree

import equinox as eqx

from ._mixed_precision import DynamicLossScale, IntScalar

__all__ = ["FlatState", "TrainState"]


class TrainState(eqx.Module):
    """The state of an Equinox training run.

    A pytree: the model, the optax state, the step counter, the PRNG key (split once per
    step; the per-step key feeds dropout-like layers), the optional `eqx.nn.State` of
    stateful layers (BatchNorm) and the optional dynamic loss scale (float16).

    Attributes:
        model: the `eqx.Module` being trained.
        opt_state: the optax optimizer state.
        step: optimizer steps taken (int32 scalar).
        key: the PRNG key of the run (`jax.random.PRNGKey` data, uint32[2]).
        model_state: `eqx.nn.State` for models built with `eqx.nn.make_with_state`.
        loss_scale: the dynamic loss scale when float16 computation is used.
    """

    model: eqx.Module
    opt_state: PyTree
    step: IntScalar
    key: PRNGKeyArray
    model_state: eqx.nn.State | None = None
    loss_scale: DynamicLossScale | None = None

    @classmethod
    def create(
        cls,
        model: eqx.Module,
        optimizer: Any,
        *,
        key: PRNGKeyArray,
        model_state: eqx.nn.State | None = None,
        loss_scale: DynamicLossScale | None = None,
    ) -> TrainState:
        """A step-0 state: `optimizer.init` on the model's arrays."""
        opt_state = optimizer.init(eqx.filter(model, eqx.is_inexact_array))
        return cls(model, opt_state, jnp.asarray(0, jnp.int32), key, model_state, loss_scale)


class FlatState:
    """The carry of the training loop: the state's array leaves in a flat list.

    `jax.jit` dispatches a list of arrays in C++; an `eqx.Module` costs a Python
    flatten per call, which is most of the per-step overhead of a small model. The
    structure (`treedef`) and the non-array parts (`static`) live on the backend.
    """

    __slots__ = ("leaves",)

    def __init__(self, leaves: list[jax.Array]):
        self.leaves = leaves

    def __repr__(self) -> str:
        return f"FlatState({len(self.leaves)} arrays)"
