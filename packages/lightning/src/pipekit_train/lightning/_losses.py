"""Core losses on torch tensors, with fused kernels for the common ones.

Core's built-in losses are written against the array API and run on torch with
autograd. For `mse`, `mae` and `huber` the adapter calls the matching
`torch.nn.functional` kernel instead (one autograd node instead of three to five, and
under `precision="bf16-mixed"` autocast computes them in float32); the definitions are
the same (mean over every element; the target is cast to the prediction's dtype). A
shape mismatch still goes to core's loss, which refuses to broadcast with a clear
error. Any other loss — a composed `Loss`, a user callable — is used as given.

With equal shapes the functional's own work (a size check and a no-op
`broadcast_tensors`, which adds an expand node to the autograd graph) is skipped: the
ATen kernel behind `torch.nn.functional` is called directly, the same kernel with the
same arguments, so the loss and its gradients are bit-identical and a small model's
step is a little shorter. A torch without those entry points uses the functionals.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["torch_loss"]

_FUSED: dict[str, Callable[..., Any]] = {
    "mse": F.mse_loss,
    "mae": F.l1_loss,
    "huber": F.huber_loss,
}
_ATEN = {"mse": "mse_loss", "mae": "l1_loss", "huber": "huber_loss"}
_MEAN = 1  # ATen's reduction enum: 0 none, 1 mean, 2 sum


def _direct(name: str, delta: float | None) -> Callable[..., Any] | None:
    """The ATen kernel of a functional loss with `reduction="mean"` (None if absent)."""
    nn = getattr(torch._C, "_nn", None)
    kernel = getattr(nn, _ATEN[name], None)
    if kernel is None:
        return None
    if delta is None:
        return functools.partial(kernel, reduction=_MEAN)
    return functools.partial(kernel, reduction=_MEAN, delta=delta)


def torch_loss(loss: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """`loss`, or a fused torch equivalent for core's `mse`/`mae`/`huber` (see the module docs)."""
    describe = getattr(loss, "describe", None)
    desc = describe() if callable(describe) else None
    if (
        not isinstance(desc, dict)
        or desc.get("name") not in _FUSED
        or set(desc) - {"name", "params"}
    ):
        return loss
    params = dict(desc.get("params") or {})
    if set(params) - {"delta"} or (params and desc["name"] != "huber"):
        return loss
    delta = float(params["delta"]) if params else None
    kernel = _direct(desc["name"], delta)
    if kernel is None:
        kernel = _FUSED[desc["name"]]
        if delta is not None:
            kernel = functools.partial(kernel, delta=delta)

    def fused(pred: Any, target: Any) -> Any:
        if (
            type(pred) is torch.Tensor
            and type(target) is torch.Tensor
            and pred.shape == target.shape
        ):
            if target.dtype != pred.dtype:
                target = target.to(pred.dtype)
            return kernel(pred, target)
        return loss(pred, target)

    fused.__name__ = fused.__qualname__ = str(desc["name"])
    fused.describe = lambda: dict(desc)  # type: ignore[attr-defined]  # functions take attributes
    return fused
