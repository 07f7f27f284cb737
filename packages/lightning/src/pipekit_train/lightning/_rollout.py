"""The device rollout of a torch module: the core rollout step in a no-grad loop on tensors.

Each segment of the rollout (`pipekit_train.core.rollout._plan`) is a
`torch.inference_mode()` loop of `RolloutSpec.bind(array_api_compat.torch)`'s step
(normalise → model → head mean → de-normalise → residual) on the module's device, in
eval mode. The states of a segment stay on the device; at its end one sum over them (a
NaN or inf anywhere makes it non-finite) checks them, the first non-finite step and
member are looked for only then, and the stored states come back to the host in one
copy. Nothing in the loop synchronises with the host.
"""

from __future__ import annotations

from typing import Any

import array_api_compat
import numpy as np
import torch

from pipekit_train.core.rollout import RolloutSpec, drive, first_bad, prepare_rollout

__all__ = ["torch_rollout"]


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.float()
    return t.cpu().numpy()


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

    Returns:
        The stored states (numpy), `(len(kept), n, *state)` (no `n` axis for one state).
    """
    if isinstance(state, torch.Tensor):
        state = _to_numpy(state)
    itemsize = torch.empty((), dtype=dtype).element_size()
    spec, x0, single, plan = prepare_rollout(state, n_steps, spec, keep, chunk, itemsize=itemsize)
    x = torch.as_tensor(x0, device=device).to(dtype)
    xp = array_api_compat.array_namespace(x)
    n = x0.shape[0]
    was_training = module.training
    module.eval()
    try:
        with torch.inference_mode():
            out_shape = tuple(module(x[:1]).shape[1:])
            step = spec.bind(
                xp,
                state_shape=x0.shape[1:],
                out_shape=out_shape,
                constant=lambda c: torch.tensor(np.array(c), device=device).to(dtype),
            )

            def run(x: torch.Tensor, first: int, length: int, stride: int) -> Any:
                states = []
                for _ in range(length):
                    x = step(module, x)
                    states.append(x)
                stacked = torch.stack(states)
                return x, stacked[stride - 1 :: stride], (stacked.sum(), stacked)

            return drive(
                plan,
                x0,
                x,
                run,
                _to_numpy,
                to_bad=lambda bad: _first_bad(bad, n),
                single=single,
            )
    finally:
        module.train(was_training)


def _first_bad(bad: tuple[torch.Tensor, torch.Tensor], n: int) -> tuple[int, int] | None:
    """`(step, member)` of a segment's first non-finite state, or None.

    A NaN or inf anywhere makes the sum of the segment's states non-finite, so one
    reduction clears a clean segment; only then (or when the sum of finite values
    overflowed) is every state checked.
    """
    total, stacked = bad
    if bool(torch.isfinite(total)):
        return None
    finite = torch.isfinite(stacked).reshape(stacked.shape[0], n, -1).all(dim=-1)
    return first_bad(finite.cpu().numpy())
