"""The device rollout of a `keras.Model`, through the Keras backend's own arrays.

- jax backend: each segment of the rollout is one jitted `lax.fori_loop` over the core
  rollout step (`RolloutSpec.bind(jax.numpy)`) around `model.stateless_call(...,
  training=False)`; the stored states go into a buffer on the device and the loop
  carries the first non-finite step and member. The segment length is traced, so every
  segment reuses one compilation.
- torch backend: a `torch.inference_mode()` loop of the same step (`array_api_compat.torch`)
  calling the model on tensors on its device; one sum over the segment's states (a NaN
  or inf makes it non-finite) checks them, and one copy brings them to the host.

The plan (segments, `keep`, `chunk`) and the step are core's
(`pipekit_train.core.rollout`), the same as the other backends'.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pipekit_train.core.rollout import RolloutSpec, drive, first_bad, prepare_rollout

__all__ = ["keras_rollout"]


def keras_rollout(
    model: Any,
    state: Any,
    n_steps: int,
    *,
    cache: dict,
    spec: RolloutSpec | None = None,
    keep: str | int = "all",
    chunk: int | None = None,
) -> np.ndarray:
    """Advance a batch of states `n_steps` steps with `model` on the backend's device.

    Args:
        model: the built `keras.Model` (called with `training=False`).
        state: one state or a batch `(n, *state)`.
        n_steps: the number of steps.
        cache: where the jax backend keeps its compiled segments.
        spec: the step's normalizer, residual and head (None: `next = model(state)`).
        keep: `"all"`, an int `k` or `"last"` (see `RolloutPlan`).
        chunk: the most steps per segment (None: bounded by memory).

    Returns:
        The stored states (numpy), `(len(kept), n, *state)` (no `n` axis for one state).
    """
    import keras

    dtype = keras.backend.standardize_dtype(model.compute_dtype)
    itemsize = np.dtype(dtype).itemsize if dtype != "bfloat16" else 2
    spec, x0, single, plan = prepare_rollout(state, n_steps, spec, keep, chunk, itemsize=itemsize)
    if keras.backend.backend() == "jax":
        return _jax(model, x0, plan, spec, dtype, cache, single)
    return _torch(model, x0, plan, spec, dtype, single)


def _jax(
    model: Any, x0: np.ndarray, plan: Any, spec: RolloutSpec, dtype: str, cache: dict, single: bool
) -> np.ndarray:
    import jax
    import jax.numpy as jnp
    from jax import lax

    trainable = [v.value for v in model.trainable_variables]
    frozen = [v.value for v in model.non_trainable_variables]
    key = (id(spec), x0.shape[1:], dtype, id(model))
    cached = cache.get(key)
    if cached is not None and cached[0] is spec:
        segment = cached[1]
    else:

        def model_fn(trainable: Any, frozen: Any) -> Callable[[Any], Any]:
            return lambda x: model.stateless_call(trainable, frozen, x, training=False)[0]

        probe = jax.ShapeDtypeStruct((1, *x0.shape[1:]), dtype)
        out = jax.eval_shape(lambda t, f, x: model_fn(t, f)(x), trainable, frozen, probe)
        step = spec.bind(
            jnp,
            state_shape=x0.shape[1:],
            out_shape=out.shape[1:],
            constant=lambda c: jnp.asarray(c, dtype),
        )

        def run_segment(
            trainable: Any, frozen: Any, x: Any, length: Any, rows: int, stride: int
        ) -> Any:
            f = model_fn(trainable, frozen)
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
            return x, (buf if rows else x[None]), jnp.stack([bad_step, bad_member])

        segment = jax.jit(run_segment, static_argnames=("rows", "stride"))
        cache[key] = (spec, segment)
    rows = 0 if plan.keep == "last" else plan.chunk // plan.stride

    def run(x: Any, first: int, length: int, stride: int) -> Any:
        x, stored, bad = segment(
            trainable, frozen, x, np.int32(length), rows, 1 if rows == 0 else stride
        )
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


def _torch(
    model: Any, x0: np.ndarray, plan: Any, spec: RolloutSpec, dtype: str, single: bool
) -> np.ndarray:
    import array_api_compat
    import torch

    weights = model.weights
    device = weights[0].value.device if weights else torch.device("cpu")
    tdtype = getattr(torch, dtype)
    x = torch.tensor(x0, device=device).to(tdtype)
    xp = array_api_compat.array_namespace(x)
    n = x0.shape[0]

    def f(z: Any) -> Any:
        return model(z, training=False)

    with torch.inference_mode():
        out_shape = tuple(f(x[:1]).shape[1:])
        step = spec.bind(
            xp,
            state_shape=x0.shape[1:],
            out_shape=out_shape,
            constant=lambda c: torch.tensor(np.array(c), device=device).to(tdtype),
        )

        def run(x: Any, first: int, length: int, stride: int) -> Any:
            states = []
            for _ in range(length):
                x = step(f, x)
                states.append(x)
            stacked = torch.stack(states)
            return x, stacked[stride - 1 :: stride], (stacked.sum(), stacked)

        def to_numpy(t: Any) -> np.ndarray:
            t = t.detach()
            return (t.float() if t.dtype in (torch.bfloat16, torch.float16) else t).cpu().numpy()

        return drive(
            plan,
            x0,
            x,
            run,
            to_numpy,
            to_bad=lambda bad: _first_bad(bad, n),
            single=single,
        )


def _first_bad(bad: tuple[Any, Any], n: int) -> tuple[int, int] | None:
    """`(step, member)` of a segment's first non-finite state, or None.

    A NaN or inf anywhere makes the sum of the segment's states non-finite, so one
    reduction clears a clean segment; only then (or when the sum of finite values
    overflowed) is every state checked.
    """
    import torch

    total, stacked = bad
    if bool(torch.isfinite(total)):
        return None
    finite = torch.isfinite(stacked).reshape(stacked.shape[0], n, -1).all(dim=-1)
    return first_bad(finite.cpu().numpy())
