"""The golden-run suite's rollout cases: training through the rollout agrees everywhere.

Each backend trains the same MLP (canonical initial weights) as a residual emulator of a
damped pendulum through `TrainingLoop(rollout=...)`: k = 4 with full backpropagation,
k = 4 pushforward, a curriculum with input noise (drawn once by core's feed), a forced
model with history, and a solver in the loop: the diverted chain against an RK4 step
(`diverted_k4`) and a model that corrects a semi-implicit Euler step (`correction_k4`),
both steppers written once with the array API and called on each backend's arrays. Every
step's loss and the final validation loss (the longest rollout) must agree with
Equinox's within the case's tolerance (1e-3 relative per step). The backends that run
the suite are those whose `GOLDEN_SETUPS` entry (tests-integration/conftest.py) lists
`"rollout"`.
"""

from __future__ import annotations

from typing import Any

import pytest

from pipekit_train.core.testing import (
    GOLDEN_ROLLOUT_CASES,
    GOLDEN_ROLLOUT_STEPS,
    compare_golden,
    load_runs,
    max_differences,
)


@pytest.fixture(scope="module")
def golden_rollouts(golden_outputs: Any) -> dict[str, dict]:
    """Every setup's `run_golden_rollout` runs (each in its own process)."""
    labels = golden_outputs.labels("rollout")
    return {label: load_runs(golden_outputs(label, "rollout")) for label in labels}


@pytest.mark.slow
def test_rollout_cases_match_equinox(golden_rollouts: dict[str, dict]) -> None:
    reference = golden_rollouts["equinox"]
    problems = []
    for label, runs in golden_rollouts.items():
        found = compare_golden(reference, runs, GOLDEN_ROLLOUT_CASES)
        table = "\n".join(
            f"  {case:28s} step {a:.1e}  val {b:.1e}"
            for case, (a, b) in max_differences(reference, runs).items()
        )
        if found:
            problems += [f"{label}:", *found, table]
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_rollout_cases_train(golden_rollouts: dict[str, dict]) -> None:
    """Every setup records every step; the loss falls; the cases differ from each other."""
    for label, runs in golden_rollouts.items():
        for case in GOLDEN_ROLLOUT_CASES:
            losses = runs[case.name].losses
            assert len(losses) == GOLDEN_ROLLOUT_STEPS, (label, case.name)
            assert sum(losses[-3:]) / 3 < 0.7 * max(losses[:6]), (label, case.name, losses)
    ref = golden_rollouts["equinox"]
    full, last = ref["rollout_k4_full"], ref["rollout_k4_pushforward"]
    assert full.losses[1:] != last.losses[1:]  # pushforward trains differently
