"""Whether a torch module may draw random numbers in its forward pass.

The step backend swaps its private RNG state in around a step only when it may
(`TorchStepBackend`). A module is deterministic when every submodule is one of the
torch layers listed here (linear, convolution, normalisation, activation, pooling,
containers, ...); a dropout layer, a module outside `torch.nn` or anything unknown counts
as random, so the RNG is carried for it.
"""

from __future__ import annotations

import torch

__all__ = ["is_deterministic"]

_NN = torch.nn
_DETERMINISTIC: tuple[type, ...] = (
    _NN.Sequential,
    _NN.ModuleList,
    _NN.ModuleDict,
    _NN.Identity,
    _NN.Flatten,
    _NN.Unflatten,
    _NN.Linear,
    _NN.Bilinear,
    _NN.Conv1d,
    _NN.Conv2d,
    _NN.Conv3d,
    _NN.ConvTranspose1d,
    _NN.ConvTranspose2d,
    _NN.ConvTranspose3d,
    _NN.Embedding,
    _NN.LayerNorm,
    _NN.GroupNorm,
    _NN.BatchNorm1d,
    _NN.BatchNorm2d,
    _NN.BatchNorm3d,
    _NN.InstanceNorm1d,
    _NN.InstanceNorm2d,
    _NN.InstanceNorm3d,
    _NN.Tanh,
    _NN.ReLU,
    _NN.LeakyReLU,
    _NN.GELU,
    _NN.SiLU,
    _NN.ELU,
    _NN.SELU,
    _NN.CELU,
    _NN.Mish,
    _NN.Sigmoid,
    _NN.Softplus,
    _NN.Softmax,
    _NN.LogSoftmax,
    _NN.Hardtanh,
    _NN.Hardswish,
    _NN.Hardsigmoid,
    _NN.PReLU,
    _NN.MaxPool1d,
    _NN.MaxPool2d,
    _NN.AvgPool1d,
    _NN.AvgPool2d,
    _NN.AdaptiveAvgPool1d,
    _NN.AdaptiveAvgPool2d,
)


def is_deterministic(module: torch.nn.Module) -> bool:
    """Whether every submodule's exact type is a known deterministic torch layer."""
    return all(type(m) in _DETERMINISTIC for m in module.modules())
