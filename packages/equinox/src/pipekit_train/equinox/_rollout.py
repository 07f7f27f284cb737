"""The device rollout of an `EquinoxModelOp`: the core rollout step inside one jitted loop.

Each segment of the rollout (`pipekit_train.core.rollout._plan`) is one compiled
`lax.fori_loop` over `RolloutSpec.bind(jax.numpy)`'s step (normalise → model → head mean →
de-normalise → residual). The loop writes the stored states into a buffer on the device
and carries the first non-finite step and member, so only the stored states and two
integers come back to the host per segment. The segment's length is a traced value:
every segment (and every later rollout of the same spec and state shape) reuses one
compilation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import equinox as eqx
from pipekit_train.core.rollout import RolloutSpec, drive, prepare_rollout

__all__ = ["equinox_rollout"]


def _float_dtype(tree: Any) -> Any:
    for leaf in jax.tree_util.tree_leaves(tree):
        if eqx.is_array(leaf) and jnp.issubdtype(leaf.dtype, jnp.floating):
            return leaf.dtype
    return jnp.float32


#: `forward(tree) -> f`: the inference function `f(batch) -> output` of a model tree.
Forward = Callable[[Any], Callable[[Any], Any]]


def _segment_fn(
    tree: Any, forward: Forward, cache: dict, spec: RolloutSpec, x0: np.ndarray, dtype: Any
) -> Callable:
    """The jitted segment for this spec and state shape (cached in `cache`)."""
    key = (id(spec), x0.shape[1:], jnp.dtype(dtype).str, jax.tree_util.tree_structure(tree))
    cached = cache.get(key)
    if cached is not None and cached[0] is spec:
        return cached[1]
    arrays, static = eqx.partition(tree, eqx.is_array)

    def model_fn(arrays: Any) -> Callable[[Any], Any]:
        return forward(eqx.combine(arrays, static))

    probe = jax.ShapeDtypeStruct((1, *x0.shape[1:]), dtype)
    out_shape = jax.eval_shape(lambda a, x: model_fn(a)(x), arrays, probe).shape[1:]
    step = spec.bind(
        jnp,
        state_shape=x0.shape[1:],
        out_shape=out_shape,
        constant=lambda c: jnp.asarray(c, dtype),
    )

    def segment(arrays: Any, x: Any, length: Any, rows: int, stride: int) -> Any:
        f = model_fn(arrays)
        n = x.shape[0]
        buf = jnp.zeros((max(rows, 1), *x.shape), x.dtype)

        def body(i: Any, carry: Any) -> Any:
            x, buf, bad_step, bad_member = carry
            x = step(f, x)
            ok = jnp.all(jnp.isfinite(x).reshape(n, -1), axis=1)
            newly = (bad_step == 0) & ~jnp.all(ok)
            bad_step = jnp.where(newly, i + 1, bad_step)
            bad_member = jnp.where(newly, jnp.argmin(ok.astype(jnp.int32)), bad_member)
            if rows:
                s = i + 1
                slot = jnp.where(s % stride == 0, s // stride - 1, s // stride)
                buf = lax.dynamic_update_index_in_dim(buf, x, slot, 0)
            return x, buf, bad_step, bad_member

        zero = jnp.zeros((), jnp.int32)
        x, buf, bad_step, bad_member = lax.fori_loop(0, length, body, (x, buf, zero, zero))
        stored = buf if rows else x[None]
        return x, stored, jnp.stack([bad_step, bad_member])

    compiled = jax.jit(segment, static_argnames=("rows", "stride"))
    cache[key] = (spec, compiled)
    return compiled


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
    """
    dtype = _float_dtype(tree)
    spec, x0, single, plan = prepare_rollout(
        state, n_steps, spec, keep, chunk, itemsize=jnp.dtype(dtype).itemsize
    )
    segment = _segment_fn(tree, forward, cache, spec, x0, dtype)
    arrays = eqx.filter(tree, eqx.is_array)
    rows = 0 if plan.keep == "last" else plan.chunk // plan.stride

    def run(x: Any, first: int, length: int, stride: int) -> Any:
        x, stored, bad = segment(arrays, x, np.int32(length), rows, 1 if rows == 0 else stride)
        return x, (stored, length // stride if rows else 1), bad

    def to_bad(bad: Any) -> tuple[int, int] | None:
        step, member = (int(v) for v in np.asarray(bad))
        return None if step == 0 else (step, member)

    return drive(
        plan,
        x0,
        jnp.asarray(x0, dtype),
        run,
        lambda stored: np.asarray(stored[0])[: stored[1]],
        to_bad=to_bad,
        single=single,
    )
