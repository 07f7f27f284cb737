"""`ReduceLROnPlateau` across backends: the same reductions at the same steps everywhere.

Each backend runs `pipekit_train.core.testing.run_golden_plateau` in its own process
(`golden_worker.py ... plateau`): `ReduceLROnPlateau(monitor="val_loss", factor=0.5,
patience=1)` on the golden MLP task, with a constant rate and with a linear schedule, on
Equinox, Lightning, `Torch()`, Keras (jax and torch) and the plain-PyTorch example
adapter. Every backend must reduce after the same validations, log the same rate at
every step and train the same losses as Equinox.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipekit_train.core.testing import PLATEAU_STEPS, PlateauRun, compare_plateau

HERE = Path(__file__).resolve().parent
# label -> (backend package, KERAS_BACKEND)
SETUPS = {
    "equinox": ("equinox", None),
    "lightning": ("lightning", None),
    "torch": ("torch", None),
    "keras-jax": ("keras", "jax"),
    "keras-torch": ("keras", "torch"),
    "plain-torch": ("plain_torch", None),
}


@pytest.fixture(scope="module")
def plateau(golden_outputs: Any) -> dict[str, dict[str, PlateauRun]]:
    """Every backend's `run_golden_plateau` runs (each in its own process: `golden_outputs`)."""
    out = {}
    for label in SETUPS:
        runs = json.loads(golden_outputs(label, "plateau"))
        out[label] = {k: PlateauRun.from_json(v) for k, v in runs.items()}
    return out


@pytest.mark.slow
def test_the_reference_reduces_and_the_rate_follows(plateau: dict) -> None:
    for name, ref in plateau["equinox"].items():
        assert ref.reduced_at, name  # the case really reduces
        assert len(ref.lrs) == len(ref.losses) == PLATEAU_STEPS, name
        scale = 0.5 ** len(ref.reduced_at)
        # after the last reduction every logged rate carries the whole scale
        assert ref.lrs[-1] == pytest.approx(scale * plateau_rate(name, PLATEAU_STEPS), rel=1e-5)


def plateau_rate(case: str, step: int) -> float:
    from pipekit_train.core.adapter import learning_rate_at
    from pipekit_train.core.testing import PLATEAU_CASES

    config = next(c for c in PLATEAU_CASES if c.name == case).optimizer_config
    return learning_rate_at(config["lr"], step)


@pytest.mark.slow
@pytest.mark.parametrize("label", ["lightning", "torch", "keras-jax", "keras-torch", "plain-torch"])
def test_every_backend_reduces_at_the_same_steps(plateau: dict, label: str) -> None:
    problems = compare_plateau(plateau["equinox"], plateau[label])
    assert not problems, "\n".join(problems)
