"""Core's learning-rate scale on torch: the base rate of a step-interval `LambdaLR`.

Plans whose callbacks change the learning rate (`ReduceLROnPlateau`) get a `LambdaLR` for
every optimizer, a constant rate included (`build_optimizer(..., lr_scale=True)`); its
base rates are `initial_lr * scale` (`initial_lr` is 1.0 for core's optimizer configs),
so the rate of update `t` is `schedule(t) * scale`. The base rates are part of the
scheduler's state dict (plain JSON), so a checkpoint keeps the scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipekit_train.core.adapter import ConfigError

__all__ = ["apply_lr_scale", "unit_rate"]


def unit_rate(count: int) -> float:
    """The multiplier of a callable `optimizer_config`'s own rate (always 1.0)."""
    return 1.0


def apply_lr_scale(optimizers: Sequence[Any], schedulers: Sequence[Any], scale: float) -> None:
    """Train at `schedule(t) * scale` from the next update on (the current one too).

    Raises:
        ConfigError: an optimizer without a `LambdaLR` (e.g. one built by your own
            `configure_optimizers`), whose rate the scale cannot reach.
    """
    import torch

    covered = set()
    for sched in schedulers:
        if not isinstance(sched, torch.optim.lr_scheduler.LambdaLR):
            continue
        opt = sched.optimizer
        covered.add(id(opt))
        sched.base_lrs = [float(g["initial_lr"]) * scale for g in opt.param_groups]
        for group, base, fn in zip(opt.param_groups, sched.base_lrs, sched.lr_lambdas, strict=True):
            rate = base * fn(sched.last_epoch)
            if isinstance(group["lr"], torch.Tensor):  # a captured step reads this tensor
                group["lr"].fill_(rate)
            else:
                group["lr"] = rate
        sched._last_lr = [group["lr"] for group in opt.param_groups]
    missing = [type(o).__name__ for o in optimizers if id(o) not in covered]
    if missing:
        raise ConfigError(
            "A callback changes the learning rate (e.g. ReduceLROnPlateau), but these "
            f"optimizers have no step-interval LambdaLR it can scale. Received: {missing}. "
            "Let the adapter build the optimizer (optimizer_config), or drop the callback."
        )
