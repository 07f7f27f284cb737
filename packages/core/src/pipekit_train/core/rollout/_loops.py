"""The device loops of a rollout, written once for the backends that share a library.

Core imports no backend, so these functions take the library as an argument: the
Equinox and Keras-on-jax rollouts call `jax_rollout(jax, ...)`, the Lightning/`Torch()`
and Keras-on-torch rollouts call `torch_rollout(torch, ...)`. Each runs a `SegmentedRollout`'s
segments through `drive`, with the step `RolloutSpec.bind` gives for the library's
arrays:

- jax: one jitted `lax.fori_loop` per segment, its length a traced value (every segment,
  and every later rollout of the same spec and state shape, reuses one compilation). The
  loop writes the stored states into a buffer and carries the first non-finite step and
  member; a stochastic step draws its noise with `jax.random.fold_in(key, step)`, so the
  draws depend on the seed and the step only (not on `chunk`).
- torch: a `torch.inference_mode()` loop per segment on the model's device. At its end
  one sum over the segment's states (a NaN or inf anywhere makes it non-finite) checks
  them; only then is every state looked at for the first bad step and member. A
  stochastic step draws from a `torch.Generator` seeded once per rollout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ._segments import SegmentedRollout, drive, first_bad
from ._step import RolloutSpec

__all__ = ["jax_rollout", "torch_rollout"]


def jax_rollout(
    jax: Any,
    model_fn: Callable[[Any], Callable[[Any], Any]],
    params: Any,
    spec: RolloutSpec,
    x0: np.ndarray,
    segmented: SegmentedRollout,
    *,
    dtype: Any,
    cache: dict,
    cache_key: Any,
    single: bool,
    stochastic: bool = False,
    seed: int = 0,
) -> np.ndarray:
    """Run `segmented` with jax: one jitted loop per segment.

    Args:
        jax: the `jax` module.
        model_fn: `model_fn(params) -> f`, `f(batch) -> raw output` (traceable).
        params: the model's arrays (a pytree; passed to the compiled loop, not captured).
        spec: the step's spec.
        x0: the initial batch of states (numpy).
        segmented: the rollout's steps and segments.
        dtype: the model's floating dtype (the states' dtype on the device).
        cache: where compiled segments are kept.
        cache_key: what else the compiled segment depends on (the model's structure).
        single: the caller passed one state.
        stochastic: sample each step from the predicted distribution.
        seed: the seed of the draws.

    Returns:
        The stored states (numpy, see `drive`).
    """
    jnp, lax = jax.numpy, jax.lax
    key = (id(spec), x0.shape, jnp.dtype(dtype).str, stochastic, cache_key)
    cached = cache.get(key)
    if cached is not None and cached[0] is spec:
        segment = cached[1]
    else:
        probe = jax.ShapeDtypeStruct(spec.probe_shape((1, *x0.shape[1:])), dtype)
        out_shape = jax.eval_shape(lambda p, x: model_fn(p)(x), params, probe).shape[1:]
        step = spec.bind(
            jnp,
            state_shape=x0.shape[1:],
            out_shape=out_shape,
            constant=lambda c: jnp.asarray(c, dtype),
            stochastic=stochastic,
        )
        noise = spec.noise_shapes(x0.shape[0], out_shape) if stochastic else None

        def run_segment(
            params: Any, x: Any, length: Any, first: Any, rng: Any, rows: int, stride: int
        ) -> Any:
            f = model_fn(params)
            n = x.shape[0]
            buf = jnp.zeros((max(rows, 1), *x.shape), x.dtype)

            def body(i: Any, carry: Any) -> Any:
                x, buf, bad_step, bad_member = carry
                if noise is None:
                    x = step(f, x)
                else:
                    k_normal, k_uniform = jax.random.split(jax.random.fold_in(rng, first + i))
                    normal = jax.random.normal(k_normal, noise["normal"], x.dtype)
                    uniform = None
                    if noise["uniform"] is not None:
                        uniform = jax.random.uniform(k_uniform, noise["uniform"], x.dtype)
                    x = step(f, x, normal, uniform)
                ok = jnp.all(jnp.isfinite(x).reshape(n, -1), axis=1)
                newly = (bad_step == 0) & ~jnp.all(ok)
                bad_step = jnp.where(newly, i + 1, bad_step)
                bad_member = jnp.where(newly, jnp.argmin(ok.astype(jnp.int32)), bad_member)
                if rows:
                    s = i + 1  # the state of step s goes to slot s // stride - 1; the
                    # steps between go to the next slot, which the next kept step overwrites
                    slot = i if stride == 1 else jnp.where(s % stride, s // stride, s // stride - 1)
                    buf = lax.dynamic_update_index_in_dim(buf, x, slot, 0)
                return x, buf, bad_step, bad_member

            zero = jnp.zeros((), jnp.int32)
            x, buf, bad_step, bad_member = lax.fori_loop(0, length, body, (x, buf, zero, zero))
            return x, (buf if rows else x[None]), jnp.stack([bad_step, bad_member])

        segment = jax.jit(run_segment, static_argnames=("rows", "stride"))
        cache[key] = (spec, segment)
    rows = 0 if segmented.keep == "last" else segmented.chunk // segmented.stride
    rng = jax.random.key(seed) if stochastic else None  # no key to make per call

    def run(x: Any, first: int, length: int, stride: int) -> Any:
        x, stored, bad = segment(
            params, x, np.int32(length), np.int32(first), rng, rows, 1 if rows == 0 else stride
        )
        return x, (stored, length // stride if rows else 1), bad

    def to_bad(bad: Any) -> tuple[int, int] | None:
        step, member = (int(v) for v in np.asarray(bad))
        return None if step == 0 else (step, member)

    return drive(
        segmented,
        x0,
        jnp.asarray(x0, dtype),
        run,
        lambda stored: np.asarray(stored[0])[: stored[1]],
        to_bad=to_bad,
        single=single,
    )


def torch_rollout(
    torch: Any,
    model_fn: Callable[[Any], Any],
    spec: RolloutSpec,
    x0: np.ndarray,
    segmented: SegmentedRollout,
    *,
    dtype: Any,
    device: Any,
    single: bool,
    stochastic: bool = False,
    seed: int = 0,
) -> np.ndarray:
    """Run `segmented` with torch: one `inference_mode` loop per segment on `device`.

    Args:
        torch: the `torch` module.
        model_fn: `model_fn(batch) -> raw output` on tensors (the model in eval mode).
        spec: the step's spec.
        x0: the initial batch of states (numpy).
        segmented: the rollout's steps and segments.
        dtype: the model's floating dtype (a `torch.dtype`).
        device: the model's device.
        single: the caller passed one state.
        stochastic: sample each step from the predicted distribution.
        seed: the seed of the `torch.Generator` the draws come from.

    Returns:
        The stored states (numpy, see `drive`).
    """
    import array_api_compat

    def to_numpy(t: Any) -> np.ndarray:
        t = t.detach()
        if t.dtype in (torch.bfloat16, torch.float16):
            t = t.float()
        return t.cpu().numpy()

    n = x0.shape[0]
    with torch.inference_mode():
        x = torch.tensor(x0, device=device).to(dtype)
        xp = array_api_compat.array_namespace(x)
        probe = x[:1]
        if spec.noise_channels:  # a generative model takes its noise channels too
            probe = torch.zeros(spec.probe_shape(tuple(probe.shape)), device=device, dtype=dtype)
        out_shape = tuple(model_fn(probe).shape[1:])
        step = spec.bind(
            xp,
            state_shape=x0.shape[1:],
            out_shape=out_shape,
            constant=lambda c: torch.tensor(np.array(c), device=device).to(dtype),
            stochastic=stochastic,
        )
        noise = spec.noise_shapes(n, out_shape) if stochastic else None
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)

        def draws() -> tuple[Any, Any]:
            assert noise is not None
            normal = torch.randn(noise["normal"], generator=generator, device=device, dtype=dtype)
            uniform = None
            if noise["uniform"] is not None:
                uniform = torch.rand(
                    noise["uniform"], generator=generator, device=device, dtype=dtype
                )
            return normal, uniform

        def run(x: Any, first: int, length: int, stride: int) -> Any:
            states = []
            for _ in range(length):
                x = step(model_fn, x) if noise is None else step(model_fn, x, *draws())
                states.append(x)
            stacked = torch.stack(states)
            return x, stacked[stride - 1 :: stride], (stacked.sum(), stacked)

        def to_bad(bad: tuple[Any, Any]) -> tuple[int, int] | None:
            total, stacked = bad
            if bool(torch.isfinite(total)):  # a NaN or inf anywhere makes the sum non-finite
                return None
            finite = torch.isfinite(stacked).reshape(stacked.shape[0], n, -1).all(dim=-1)
            return first_bad(finite.cpu().numpy())

        return drive(segmented, x0, x, run, to_numpy, to_bad=to_bad, single=single)
