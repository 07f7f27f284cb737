"""Model factories for tests, examples and benchmarks (importable by name).

`LightningModelOp("pipekit_train.lightning.testing:linear", in_size=4, out_size=1)` is the
model the conformance suite trains.
"""

from __future__ import annotations

import torch

from pipekit_train.core import model_factory

__all__ = ["linear", "mlp", "tied"]


@model_factory
def linear(in_size: int, out_size: int) -> torch.nn.Linear:
    """A dense affine map `in_size → out_size` (`torch.nn.Linear`)."""
    return torch.nn.Linear(int(in_size), int(out_size))


@model_factory
def mlp(
    in_size: int, out_size: int, width: int = 32, depth: int = 1, dropout: float = 0.0
) -> torch.nn.Sequential:
    """A tanh MLP with `depth` hidden layers of `width` units and optional dropout."""
    layers: list[torch.nn.Module] = []
    size = int(in_size)
    for _ in range(int(depth)):
        layers += [torch.nn.Linear(size, int(width)), torch.nn.Tanh()]
        if dropout:
            layers.append(torch.nn.Dropout(float(dropout)))
        size = int(width)
    layers.append(torch.nn.Linear(size, int(out_size)))
    return torch.nn.Sequential(*layers)


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
