"""The device rollout of a torch module: the core rollout step in a no-grad loop on tensors.

Each segment of the rollout (`pipekit_train.core.rollout.RolloutPlan`) is a
`torch.inference_mode()` loop of `RolloutSpec.bind(array_api_compat.torch)`'s step
(normalise → model → head mean → de-normalise → residual, or a draw from the predicted
distribution) on the module's device, in eval mode: core's `torch_rollout`, shared with
Keras on torch. The states of a segment stay on the device; at its end one sum over
them (a NaN or inf anywhere makes it non-finite) checks them, the first non-finite step
and member are looked for only then, and the stored states come back to the host in one
copy. Nothing in the loop synchronises with the host.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pipekit_train.core.rollout import RolloutSpec, prepare_rollout
from pipekit_train.core.rollout import torch_rollout as run_rollout

__all__ = ["torch_rollout"]


def torch_rollout(
    module: torch.nn.Module,
    state: Any,
    n_steps: int,
    *,
    dtype: torch.dtype,
    device: torch.device,
    spec: RolloutSpec | None = None,
    keep: str | int = "all",
    chunk: int | None = None,
    stochastic: bool = False,
    seed: int = 0,
) -> np.ndarray:
    """Advance a batch of states `n_steps` steps with `module` on `device`.

    Args:
        module: the torch module (run in eval mode; its training mode is restored).
        state: one state or a batch `(n, *state)` (numpy or a tensor).
        n_steps: the number of steps.
        dtype: the module's floating dtype (the states' dtype on the device).
        device: the module's device.
        spec: the step's normalizer, residual and head (None: `next = module(state)`).
        keep: `"all"`, an int `k` or `"last"` (see `RolloutPlan`).
        chunk: the most steps per segment (None: bounded by memory).
        stochastic: draw each step from the predicted distribution.
        seed: the seed of the `torch.Generator` of the draws.

    Returns:
        The stored states (numpy), `(len(kept), n, *state)` (no `n` axis for one state).
    """
    if isinstance(state, torch.Tensor):
        state = state.detach().float().cpu().numpy()
    itemsize = torch.empty((), dtype=dtype).element_size()
    spec, x0, single, plan = prepare_rollout(
        state, n_steps, spec, keep, chunk, itemsize=itemsize, stochastic=stochastic, seed=seed
    )
    was_training = module.training
    module.eval()
    try:
        return run_rollout(
            torch,
            module,
            spec,
            x0,
            plan,
            dtype=dtype,
            device=device,
            single=single,
            stochastic=stochastic,
            seed=seed,
        )
    finally:
        module.train(was_training)
