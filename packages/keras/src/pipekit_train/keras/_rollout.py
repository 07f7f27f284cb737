"""The device rollout of a `keras.Model`, through the Keras backend's own arrays.

- jax backend: each segment of the rollout is one jitted `lax.fori_loop` over the core
  rollout step (`RolloutSpec.bind(jax.numpy)`) around `model.stateless_call(...,
  training=False)`: core's `jax_rollout`, the loop the Equinox rollout runs.
- torch backend: a `torch.inference_mode()` loop of the same step
  (`array_api_compat.torch`) calling the model on tensors on its device: core's
  `torch_rollout`, the loop the Lightning rollout runs.

The plan (segments, `keep`, `chunk`) and the step are core's
(`pipekit_train.core.rollout`), the same as the other backends'.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipekit_train.core.adapter import RolloutSpec, jax_rollout, prepare_rollout, torch_rollout

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
    stochastic: bool = False,
    seed: int = 0,
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
        stochastic: draw each step from the predicted distribution.
        seed: the seed of the draws.

    Returns:
        The stored states (numpy), `(len(kept), n, *state)` (no `n` axis for one state).
    """
    import keras

    dtype = keras.backend.standardize_dtype(model.compute_dtype)
    itemsize = np.dtype(dtype).itemsize if dtype != "bfloat16" else 2
    spec, x0, single, plan = prepare_rollout(
        state, n_steps, spec, keep, chunk, itemsize=itemsize, stochastic=stochastic, seed=seed
    )
    options: dict[str, Any] = {"single": single, "stochastic": stochastic, "seed": seed}
    if keras.backend.backend() == "jax":
        import jax

        params = (
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
        )

        def model_fn(params: Any) -> Any:
            return lambda x: model.stateless_call(params[0], params[1], x, training=False)[0]

        return jax_rollout(
            jax,
            model_fn,
            params,
            spec,
            x0,
            plan,
            dtype=dtype,
            cache=cache,
            cache_key=id(model),
            **options,
        )
    import torch

    weights = model.weights
    device = weights[0].value.device if weights else torch.device("cpu")
    return torch_rollout(
        torch,
        lambda x: model(x, training=False),
        spec,
        x0,
        plan,
        dtype=getattr(torch, dtype),
        device=device,
        **options,
    )
