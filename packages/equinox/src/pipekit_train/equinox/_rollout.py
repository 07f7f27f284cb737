"""The device rollout of an `EquinoxModelOp`: the core rollout step inside one jitted loop.

Each segment of the rollout (`pipekit_train.core.rollout.RolloutPlan`) is one compiled
`lax.fori_loop` over `RolloutSpec.bind(jax.numpy)`'s step (normalise → model → head mean →
de-normalise → residual, or a draw from the predicted distribution), in inference mode:
core's `jax_rollout`, shared with Keras on jax. The loop writes the stored states into a
buffer on the device and carries the first non-finite step and member, so only the
stored states and two integers come back to the host per segment. The segment's length
is a traced value: every segment (and every later rollout of the same spec and state
shape) reuses one compilation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import equinox as eqx
from pipekit_train.core.rollout import RolloutSpec, jax_rollout, prepare_rollout

__all__ = ["equinox_rollout"]


def _float_dtype(tree: Any) -> Any:
    for leaf in jax.tree_util.tree_leaves(tree):
        if eqx.is_array(leaf) and jnp.issubdtype(leaf.dtype, jnp.floating):
            return leaf.dtype
    return jnp.float32


#: `forward(tree) -> f`: the inference function `f(batch) -> output` of a model tree.
Forward = Callable[[Any], Callable[[Any], Any]]


def equinox_rollout(
    tree: Any,
    forward: Forward,
    cache: dict,
    state: Any,
    n_steps: int,
    *,
    spec: RolloutSpec | None = None,
    keep: str | int = "all",
    chunk: int | None = None,
    stochastic: bool = False,
    seed: int = 0,
) -> np.ndarray:
    """Advance a batch of states `n_steps` steps on the model's device.

    Args:
        tree: the model's pytree (the module, or `(module, state)`).
        forward: builds the inference function of a tree (see `Forward`).
        cache: where compiled segments are kept (per spec, state shape, dtype, structure).
        state: as for `EquinoxModelOp.rollout`.
        n_steps: as for `EquinoxModelOp.rollout`.
        spec: as for `EquinoxModelOp.rollout`.
        keep: as for `EquinoxModelOp.rollout`.
        chunk: as for `EquinoxModelOp.rollout`.
        stochastic: as for `EquinoxModelOp.rollout`.
        seed: as for `EquinoxModelOp.rollout`.
    """
    parts = tree if isinstance(tree, tuple) else (tree,)
    held = cache.get("tree")  # the partition of the last tree (a model changes rarely)
    if (
        held is None
        or len(held[0]) != len(parts)
        or any(a is not b for a, b in zip(held[0], parts, strict=True))
    ):
        arrays, static = eqx.partition(tree, eqx.is_array)
        held = (parts, arrays, static, _float_dtype(tree), jax.tree_util.tree_structure(tree))
        cache["tree"] = held
    _, arrays, static, dtype, structure = held
    spec, x0, single, plan = prepare_rollout(
        state,
        n_steps,
        spec,
        keep,
        chunk,
        itemsize=jnp.dtype(dtype).itemsize,
        stochastic=stochastic,
        seed=seed,
    )
    return jax_rollout(
        jax,
        lambda params: forward(eqx.combine(params, static)),
        arrays,
        spec,
        x0,
        plan,
        dtype=dtype,
        cache=cache,
        cache_key=structure,
        single=single,
        stochastic=stochastic,
        seed=seed,
    )
