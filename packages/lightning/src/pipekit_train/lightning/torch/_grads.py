"""`GradReset`: `optimizer.zero_grad(set_to_none=True)` without its per-call overhead.

For torch's own `zero_grad` with `set_to_none=True` the effect is exactly `p.grad = None`
for every parameter of every group; the method also opens a profiler range and
re-checks its options on each call, which on a small model is a measurable share of a
step. `GradReset` does the assignment over a parameter list gathered once per
optimizer (again when its groups change); an optimizer that overrides `zero_grad` (or a
patched instance) keeps its own method.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["GradReset"]

_BASE = torch.optim.Optimizer.zero_grad


class GradReset:
    """Reset the gradients of an optimizer's parameters to None (see the module docs)."""

    __slots__ = ("_optimizer", "_groups", "_params")

    def __init__(self) -> None:
        self._optimizer: Any = None
        self._groups = -1
        self._params: list[torch.Tensor] | None = None

    def _bind(self, optimizer: Any) -> None:
        self._optimizer, self._groups = optimizer, len(optimizer.param_groups)
        own = type(optimizer).zero_grad is not _BASE or "zero_grad" in vars(optimizer)
        self._params = (
            None if own else [p for group in optimizer.param_groups for p in group["params"]]
        )

    def __call__(self, optimizer: Any) -> None:
        """Set every parameter's `.grad` to None, as `optimizer.zero_grad(set_to_none=True)`."""
        if optimizer is not self._optimizer or len(optimizer.param_groups) != self._groups:
            self._bind(optimizer)
        params = self._params
        if params is None:
            optimizer.zero_grad(set_to_none=True)
            return
        for p in params:
            p.grad = None
