"""The moving average of the weights (`optimizer_config["ema"]`) in the torch optimizer state.

`with_ema(optimizer, decay)` turns an optimizer into one whose `step()` also updates
`state[p]["ema"]` for every parameter it steps: a copy of the parameter from before its
first update, then `decay * ema + (1 - decay) * p` after every step. Living in the
optimizer's own state dict, the average is checkpointed with it (safetensors, no
pickle), and a skipped step (`on_nonfinite="skip"`, which never calls `step()`) leaves
it unchanged; with gradient accumulation `step()` runs once per update. A parameter that
never received a gradient has no average: it still holds its initial value.

`swapped_in(optimizers)` puts the averages into the parameters for a while (validation);
`averaged_copy(module, optimizers)` is a copy of the module holding them (the artifact).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from typing import Any

import torch

__all__ = ["averaged_copy", "has_ema", "swapped_in", "with_ema"]

_KEY = "ema"


@cache
def _averaged(base: type) -> type:
    """`base` with the moving average of the weights kept in its state (see the module)."""

    class Averaged(base):
        ema_decay: float

        def step(self, closure: Any = None) -> Any:
            with torch.no_grad():
                before = {
                    p: p.detach().clone()
                    for group in self.param_groups
                    for p in group["params"]
                    if _KEY not in self.state.get(p, {})
                }
            loss = super().step(closure)
            d = self.ema_decay
            with torch.no_grad():
                for group in self.param_groups:
                    for p in group["params"]:
                        state = self.state.get(p)
                        if state is None or (_KEY not in state and p.grad is None):
                            continue  # never stepped: its value is still the initial one
                        if _KEY not in state:
                            state[_KEY] = before[p]
                        state[_KEY].mul_(d).add_(p.detach(), alpha=1.0 - d)
            return loss

    Averaged.__name__ = Averaged.__qualname__ = f"Averaged{base.__name__}"
    return Averaged


def with_ema(optimizer: Any, decay: float) -> Any:
    """The same optimizer object, now keeping the average (its class becomes a subclass)."""
    base: Any = type(optimizer)
    optimizer.__class__ = _averaged(base)
    optimizer.ema_decay = float(decay)
    return optimizer


def has_ema(optimizers: Sequence[Any]) -> bool:
    """Whether any of the optimizers keeps an average."""
    return any(hasattr(opt, "ema_decay") for opt in optimizers)


def _averages(optimizers: Sequence[Any]) -> list[tuple[Any, Any]]:
    out = []
    for opt in optimizers:
        if not hasattr(opt, "ema_decay"):
            continue
        for group in opt.param_groups:
            for p in group["params"]:
                ema = opt.state.get(p, {}).get(_KEY)
                if ema is not None:
                    out.append((p, ema))
    return out


@contextmanager
def swapped_in(optimizers: Sequence[Any]) -> Iterator[None]:
    """The parameters hold their averages inside the block, their own values again after."""
    pairs = _averages(optimizers)
    with torch.no_grad():
        saved = [p.detach().clone() for p, _ in pairs]
        for p, ema in pairs:
            p.copy_(ema)
    try:
        yield
    finally:
        with torch.no_grad():
            for (p, _), value in zip(pairs, saved, strict=True):
                p.copy_(value)


def averaged_copy(module: torch.nn.Module, optimizers: Sequence[Any]) -> torch.nn.Module | None:
    """A deep copy of `module` holding the averages (None when no optimizer keeps one)."""
    if not has_ema(optimizers):
        return None
    with swapped_in(optimizers):
        return copy.deepcopy(module)
