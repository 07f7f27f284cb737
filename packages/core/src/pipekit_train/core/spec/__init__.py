"""The frozen description of a run, and the vocabulary every backend runs the same way.

`Plan` (`_plan`), the canonical optimizer spec (`_optimizer`), learning-rate schedules
(`_schedules`), the typed policies `Precision` and `NonFinitePolicy` (`_policies`), the
learning-rate scale (`_lr_scale`) and the preemption signals and time budget a plan
names (`_signals`). Validated here once; each adapter only translates.

A *spec* in core is always such a description: frozen, validated once, translated by a
backend (the run's here; an optimizer's `OptimizerSpec`; a rollout step's `RolloutSpec`
in `pipekit_train.core.rollout`; an array's `ArraySpec` in `pipekit_train.core.data`).

The public names: `Plan`, `OptimizerSpec`/`optimizer_spec` with the table of optimizer
names and hyperparameters `OPTIMIZERS`, the schedules `SCHEDULES` with `check_schedule`
and `learning_rate_at` (a schedule's curve in plain Python), the precisions `PRECISIONS`
with `resolve_precision`, `canonical_precision` and `translate_precision`, and the
policies `Precision` and `NonFinitePolicy`.
"""

from ._optimizer import (
    OPTIMIZERS,
    PRECISIONS,
    OptimizerSpec,
    canonical_precision,
    optimizer_spec,
    resolve_precision,
    translate_precision,
)
from ._plan import Plan
from ._policies import NonFinitePolicy, Precision
from ._schedules import SCHEDULES, check_schedule, learning_rate_at

__all__ = [
    "OPTIMIZERS",
    "PRECISIONS",
    "SCHEDULES",
    "NonFinitePolicy",
    "OptimizerSpec",
    "Plan",
    "Precision",
    "canonical_precision",
    "check_schedule",
    "learning_rate_at",
    "optimizer_spec",
    "resolve_precision",
    "translate_precision",
]
