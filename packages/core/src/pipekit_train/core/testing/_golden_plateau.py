"""Golden runs with `ReduceLROnPlateau`: the same reductions at the same steps everywhere.

Each case trains the golden MLP task (`golden_task`, `golden_weights`) with
`ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=1)`, validating every
`PLATEAU_VALIDATE_EVERY` steps, and records the learning rate of every step
(`LearningRateLogger`), the steps where the rate was reduced, the training losses and the
validation losses. `compare_plateau` checks two backends' runs: the same reduction steps,
the same rates (to float32 rounding) and the losses within `rtol`.

```python
from pipekit_train.core.testing import compare_plateau, run_golden_plateau
from pipekit_train.equinox.testing import golden_backend

runs = run_golden_plateau(golden_backend())
```
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from pipekit_train.core import TrainingLoop
from pipekit_train.core.callbacks import LearningRateLogger, ReduceLROnPlateau

from ._golden import GoldenBackend, GoldenCase, golden_task, golden_weights

__all__ = [
    "PLATEAU_CASES",
    "PLATEAU_STEPS",
    "PLATEAU_VALIDATE_EVERY",
    "PlateauRun",
    "compare_plateau",
    "plateau_loop",
    "run_golden_plateau",
]

PLATEAU_STEPS = 120
"""Optimizer steps per case."""

PLATEAU_VALIDATE_EVERY = 10
"""Steps between two validations (each one a chance to reduce)."""

PLATEAU_CASES: tuple[GoldenCase, ...] = (
    GoldenCase("plateau_adam", {"name": "adam", "lr": 0.08}),
    GoldenCase(
        "plateau_linear_adam",
        {
            "name": "adam",
            "lr": {
                "schedule": "linear",
                "init_value": 0.1,
                "end_value": 0.02,
                "transition_steps": PLATEAU_STEPS,
            },
        },
    ),
)
"""A constant rate and a schedule (the effective rate is `schedule(step) * scale`)."""


@dataclass
class PlateauRun:
    """One plateau case on one backend.

    Attributes:
        case: the case name.
        backend: the backend label.
        lrs: the learning rate of every step (as `LearningRateLogger` logs it).
        reduced_at: the steps after whose validation the rate was reduced.
        losses: the training loss of every step.
        val_losses: the validation loss of every validation.
    """

    case: str
    backend: str
    lrs: list[float] = field(default_factory=list)
    reduced_at: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    val_losses: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """JSON (for runs made in another process)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PlateauRun:
        """The inverse of `to_json`."""
        return cls(**dict(data))


def plateau_loop(backend: GoldenBackend, case: GoldenCase, **overrides: Any) -> TrainingLoop:
    """The `TrainingLoop` of one plateau case (fresh callbacks; `overrides` replace kwargs)."""
    train, val = golden_task()
    kwargs: dict[str, Any] = {
        "model": backend.model_from_weights(golden_weights()),
        "data": train,
        "validation": val,
        "loss": "mse",
        "optimizer_config": dict(case.optimizer_config),
        "batch_size": 32,
        "max_steps": PLATEAU_STEPS,
        "accumulate_grad_batches": case.accumulate_grad_batches,
        "validate_every_n_steps": PLATEAU_VALIDATE_EVERY,
        "log_every_n_steps": PLATEAU_VALIDATE_EVERY,
        "seed": 0,
        "adapter": backend.adapter(case.precision),
        "progress": False,
        "callbacks": [
            ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=1),
            LearningRateLogger(),
        ],
    }
    kwargs.update(overrides)
    return TrainingLoop(**kwargs)


def run_golden_plateau(
    backend: GoldenBackend, cases: Iterable[GoldenCase] = PLATEAU_CASES
) -> dict[str, PlateauRun]:
    """Train every plateau case on `backend`; return the runs by case."""
    runs: dict[str, PlateauRun] = {}
    for case in cases:
        loop = plateau_loop(backend, case)
        plateau = loop.plan.callbacks[0]
        assert isinstance(plateau, ReduceLROnPlateau)  # plateau_loop put it first
        artifact = loop.run()
        runs[case.name] = PlateauRun(
            case=case.name,
            backend=backend.name,
            lrs=[float(v) for v in artifact.history["lr"]],
            reduced_at=list(plateau.reduced_at),
            losses=[float(v) for v in artifact.history["loss"]],
            val_losses=[float(v) for v in artifact.history["val_loss"]],
        )
    return runs


def _relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def compare_plateau(
    reference: Mapping[str, PlateauRun],
    other: Mapping[str, PlateauRun],
    cases: Iterable[GoldenCase] = PLATEAU_CASES,
    *,
    lr_rtol: float = 1e-6,
) -> list[str]:
    """Every disagreement, as readable lines (empty: the runs agree).

    The reduction steps must be equal, every step's rate within `lr_rtol` (float32
    rounding of `schedule(step) * scale`), the losses within the case's `rtol`.
    """
    problems: list[str] = []
    for case in cases:
        ref, got = reference.get(case.name), other.get(case.name)
        if ref is None or got is None:
            problems.append(f"{case.name}: missing on {'reference' if ref is None else 'other'}")
            continue
        if got.reduced_at != ref.reduced_at:
            problems.append(
                f"{case.name}: {got.backend} reduced at steps {got.reduced_at}, "
                f"{ref.backend} at {ref.reduced_at}"
            )
        for label, a, b, tol in (
            ("lr", got.lrs, ref.lrs, lr_rtol),
            ("loss", got.losses, ref.losses, case.rtol),
            ("val_loss", got.val_losses, ref.val_losses, case.rtol),
        ):
            if len(a) != len(b):
                problems.append(f"{case.name}: {label}: {len(a)} values vs {len(b)}")
                continue
            worst = max(
                ((_relative(x, y), i) for i, (x, y) in enumerate(zip(a, b, strict=True))),
                default=(0.0, 0),
            )
            if not worst[0] <= tol or any(math.isnan(x) for x in a):
                problems.append(
                    f"{case.name}: {label}: {got.backend} vs {ref.backend}: value {worst[1]} "
                    f"differs by {worst[0]:.2e} relative (rtol {tol:g})"
                )
    return problems
