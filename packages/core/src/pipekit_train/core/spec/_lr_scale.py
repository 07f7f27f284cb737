"""The learning-rate scale: the one mechanism by which a callback changes the rate.

A run owns one number, the *learning-rate scale* `s` (1.0 until a callback changes it
with `RunState.set_lr_scale`). Every backend trains with the effective rate
`schedule(step) * s`, where `schedule` is the plan's learning rate (a constant or one
of core's schedules):

| backend | how the step reads `s` |
|---|---|
| numpy reference (`NumpyAdapter`) | multiplies its rate by `s` |
| Equinox | a scalar in the optimizer state that scales the update (no recompilation) |
| Lightning, `Torch()` | the base rate of a step-interval `LambdaLR` (`base_lrs`) |
| Keras 3 (jax, torch) | an optimizer variable multiplying the learning-rate schedule |

Only plans with a callback that sets `adjusts_learning_rate = True` (such as
`ReduceLROnPlateau`) build the scaled variant, so runs without one are unchanged. `s`
is saved in every checkpoint's run state and restored on resume; the backend is told
the current value once before the first step and after every change.
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any

from pipekit_train.core._errors import ConfigError

if TYPE_CHECKING:
    from ._plan import Plan

__all__ = ["adjusts_learning_rate", "check_lr_scale"]


def adjusts_learning_rate(plan: Plan | Any) -> bool:
    """Whether a plan (or a list of callbacks) has a callback that sets the rate's scale."""
    callbacks: Any = getattr(plan, "callbacks", plan)
    return any(bool(getattr(cb, "adjusts_learning_rate", False)) for cb in callbacks or ())


def check_lr_scale(scale: Any) -> float:
    """The scale as a float; raises for anything but a finite number > 0."""
    if (
        isinstance(scale, bool)
        or not isinstance(scale, numbers.Real)
        or not math.isfinite(scale)
        or scale <= 0
    ):
        raise ConfigError(
            f"The learning-rate scale must be a finite number > 0. Received: scale={scale!r}. "
            "Pass e.g. 0.5 to halve the rate."
        )
    return float(scale)
