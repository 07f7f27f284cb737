"""Shape probes of torch networks, shared by `Lightning` and `Torch`.

`output_shape` runs one zero row through a plain `forward(x)` network (eval mode, no
autograd, a forked torch RNG; the training mode is restored); `expected_input_shape`
reads the input size of a `torch.nn.Sequential` that starts with a `Linear` layer.
Only networks a probe may call as `net(x)` are probed (`probe_target`): a user
`LightningModule` (its `training_step` decides what reaches the model), a module with
uninitialised lazy layers (the probe would initialise them) or another `forward`
signature gives None. `stepper_shape` calls a rollout's stepper once on a batch of zero
states (CPU tensors, no autograd).
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch

from ._model import TorchModelOp, as_input, is_lightning_module, module_dtype

__all__ = ["expected_input_shape", "output_shape", "probe_target", "stepper_shape"]


def probe_target(model: Any) -> torch.nn.Module | None:
    """The network a shape probe may call as `net(x)`, or None when in doubt."""
    net = model.model if isinstance(model, TorchModelOp) else model
    if not isinstance(net, torch.nn.Module) or is_lightning_module(net):
        return None
    if any(
        isinstance(m, torch.nn.modules.lazy.LazyModuleMixin) and m.has_uninitialized_params()
        for m in net.modules()
    ):
        return None
    try:
        params = list(inspect.signature(net.forward).parameters.values())
    except (TypeError, ValueError):
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in params if p.default is inspect.Parameter.empty]
    if (
        not params
        or params[0].kind not in positional
        or any(p.kind is inspect.Parameter.KEYWORD_ONLY for p in required)
        or len([p for p in required if p.kind in positional]) > 1
    ):
        return None
    return net


def output_shape(
    model: Any, input_shape: tuple[int, ...], dtype: Any = np.float32
) -> tuple[int, ...] | None:
    """The prediction's shape, from a forward pass of one zero row (see the module docs)."""
    net = probe_target(model)
    if net is None:
        return None
    param_dtype, device = module_dtype(net)
    x = as_input(np.zeros((1, *input_shape[1:]), dtype), param_dtype, device)
    was_training = net.training
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        net.eval()
        try:
            with torch.no_grad():
                out = net(x)
        finally:
            net.train(was_training)
    if not isinstance(out, torch.Tensor) or out.ndim == 0:
        return None
    return (input_shape[0], *(int(d) for d in out.shape[1:]))


def expected_input_shape(model: Any) -> tuple[int, ...] | None:
    """`(in_features,)` of a `torch.nn.Sequential` that starts with a `Linear` layer."""
    net = probe_target(model)
    if isinstance(net, torch.nn.Sequential) and len(net) > 0:
        first = net[0]
        if isinstance(first, torch.nn.Linear):
            return (int(first.in_features),)
    return None


def stepper_shape(
    stepper: Any, state_shape: tuple[int, ...], dtype: Any = np.float32
) -> tuple[int, ...] | None:
    """The output shape of a rollout's stepper on a batch of zero states (CPU tensors of
    `dtype`, under `torch.no_grad()`); None when it does not return a tensor."""
    x = torch.from_numpy(np.zeros(tuple(state_shape), np.dtype(dtype)))
    with torch.no_grad():
        out = stepper(x)
    shape = getattr(out, "shape", None)
    return None if shape is None else tuple(int(d) for d in shape)
