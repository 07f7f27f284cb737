"""Model factories for tests, examples and benchmarks (importable by name).

`LightningModelOp("pipekit_train.lightning.testing:linear", in_size=4, out_size=1)` is the
model the conformance suite trains.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from pipekit_train.core import model_factory

__all__ = [
    "conv_from_weights",
    "conv_net",
    "golden_backend",
    "linear",
    "mlp",
    "mlp_from_weights",
    "mlp_weights",
    "tied",
    "torch_golden_backend",
]

_ACTIVATIONS = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}


@model_factory
def linear(in_size: int, out_size: int) -> torch.nn.Linear:
    """A dense affine map `in_size → out_size` (`torch.nn.Linear`)."""
    return torch.nn.Linear(int(in_size), int(out_size))


@model_factory
def mlp(
    in_size: int,
    out_size: int,
    width: int = 32,
    depth: int = 1,
    activation: str = "tanh",
    dropout: float = 0.0,
) -> torch.nn.Sequential:
    """An MLP: `depth` hidden layers of `width` with `activation`, optional dropout.

    The same architecture and initialisation family (torch's default, uniform
    `±1/sqrt(fan_in)`) as `mlp` in `pipekit_train.equinox.testing` and
    `pipekit_train.keras.testing`.
    """
    layers: list[torch.nn.Module] = []
    size = int(in_size)
    for _ in range(int(depth)):
        layers += [torch.nn.Linear(size, int(width)), _ACTIVATIONS[activation]()]
        if dropout:
            layers.append(torch.nn.Dropout(float(dropout)))
        size = int(width)
    layers.append(torch.nn.Linear(size, int(out_size)))
    return torch.nn.Sequential(*layers)


@model_factory
def conv_net(
    in_channels: int,
    out_channels: int,
    width: int = 16,
    depth: int = 2,
    kernel_size: int = 3,
    activation: str = "tanh",
) -> torch.nn.Sequential:
    """A periodic conv net, channels-first as torch is: `(N, C_in, H, W) -> (N, C_out, H, W)`.

    `depth` hidden `Conv2d` layers of `width` with `activation`, each padded periodically
    (`padding_mode="circular"`). Train it on pipekit-train's channels-last datasets with
    `LightningModelOp(..., layout="channels_last")`, which permutes at the boundary. The
    same architecture and initialisation family (torch's default, uniform `±1/sqrt(fan_in)`
    with `fan_in = in_channels * kernel_size**2`) as `conv_net` in
    `pipekit_train.equinox.testing` and `pipekit_train.keras.testing`.
    """
    sizes = [int(in_channels)] + [int(width)] * int(depth) + [int(out_channels)]
    layers: list[torch.nn.Module] = []
    for i, (c_in, c_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        k = int(kernel_size)
        layers.append(torch.nn.Conv2d(c_in, c_out, k, padding=k // 2, padding_mode="circular"))
        if i < len(sizes) - 2:
            layers.append(_ACTIVATIONS[activation]())
    return torch.nn.Sequential(*layers)


def conv_from_weights(weights: Sequence[np.ndarray], activation: str = "tanh") -> Any:
    """A channels-last `LightningModelOp` of `conv_net` holding canonical weights `[K0, b0, ...]`.

    `K` has shape `(kh, kw, c_in, c_out)` (see `pipekit_train.core.testing.golden_conv_weights`).
    """
    from pipekit_train.core.testing import conv_sizes
    from pipekit_train.lightning import LightningModelOp

    op = LightningModelOp(
        "pipekit_train.lightning.testing:conv_net",
        layout="channels_last",
        activation=activation,
        **conv_sizes(weights),
    )
    convs = [m for m in op.model.modules() if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        for i, layer in enumerate(convs):
            kernel = np.transpose(weights[2 * i], (3, 2, 0, 1))
            layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(kernel)))
            assert layer.bias is not None  # conv_net's convolutions have biases
            layer.bias.copy_(torch.from_numpy(weights[2 * i + 1]))
    return op


class _Tied(torch.nn.Module):
    def __init__(self, size: int):
        super().__init__()
        self.encode = torch.nn.Linear(size, size, bias=False)
        self.decode = torch.nn.Linear(size, size, bias=False)
        self.decode.weight = self.encode.weight  # tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(torch.tanh(self.encode(x)))


@model_factory
def tied(size: int) -> torch.nn.Module:
    """A two-layer model whose layers share one weight matrix (tests tied-weight storage)."""
    return _Tied(int(size))


def mlp_from_weights(weights: Sequence[np.ndarray], activation: str = "tanh") -> Any:
    """A `LightningModelOp` of `mlp` holding canonical weights `[W0, b0, W1, b1, ...]`.

    `W` has shape `(fan_in, fan_out)` (see `pipekit_train.core.testing.golden_weights`).
    """
    from pipekit_train.core.testing import mlp_sizes
    from pipekit_train.lightning import LightningModelOp

    op = LightningModelOp(
        "pipekit_train.lightning.testing:mlp", activation=activation, **mlp_sizes(weights)
    )
    linears = [m for m in op.model.modules() if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        for i, layer in enumerate(linears):
            layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(weights[2 * i].T)))
            layer.bias.copy_(torch.from_numpy(weights[2 * i + 1]))
    return op


def mlp_weights(op: Any) -> list[np.ndarray]:
    """The canonical weights `[W0, b0, W1, b1, ...]` of an `mlp` operator (`W`: `(in, out)`)."""
    out: list[np.ndarray] = []
    for layer in (m for m in op.model.modules() if isinstance(m, torch.nn.Linear)):
        out += [layer.weight.detach().numpy().T.copy(), layer.bias.detach().numpy().copy()]
    return out


def golden_backend() -> Any:
    """The Lightning backend of the cross-backend golden-run suite."""
    from pipekit_train.core.testing import GoldenBackend
    from pipekit_train.lightning import Lightning

    return GoldenBackend(
        name="lightning",
        model_from_weights=mlp_from_weights,
        adapter=lambda p: Lightning(accelerator="cpu", precision=p),
        conv_from_weights=conv_from_weights,
        weights_of=mlp_weights,
    )


def torch_golden_backend(steps_per_execution: int = 1) -> Any:
    """The `Torch()` backend of the cross-backend golden-run suite."""
    from pipekit_train.core.testing import GoldenBackend
    from pipekit_train.lightning import Torch

    return GoldenBackend(
        name="torch" if steps_per_execution == 1 else f"torch-k{steps_per_execution}",
        model_from_weights=mlp_from_weights,
        adapter=lambda p: Torch(precision=p, steps_per_execution=steps_per_execution),
        weights_of=mlp_weights,
    )
