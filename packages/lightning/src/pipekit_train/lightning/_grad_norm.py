"""The `grad_norm` metric in torch (`TrainingLoop(log_grad_norm=True)`).

Core defines it (`pipekit_train.core.adapter.global_grad_norm`): the global L2 norm of
the gradient an update applies, before clipping. Torch computes the same quantity with
its fused per-tensor norms (`torch.nn.utils.get_total_norm`, what `clip_grad_norm_`
uses); where `clip_norm` is set, the norm `clip_grad_norm_` returns is that value.
"""

from __future__ import annotations

import torch

__all__ = ["grad_norm"]


def grad_norm(module: torch.nn.Module) -> torch.Tensor:
    """The global L2 norm of the module's gradients (a 0-d tensor, on the device)."""
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if not grads:
        return torch.zeros(())
    return torch.nn.utils.get_total_norm(grads, 2.0)
