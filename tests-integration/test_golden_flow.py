"""The golden-run suite's flow case: the same weights give the same flow on every backend.

Each backend builds its MLP from the canonical weights with `flow_width(2, 2, 4)` outputs
(`run_golden_flow`, each backend in its own process): the `Flow`'s `log_prob` at fixed
targets and its samples from a fixed seed agree with Equinox's to 1e-4 before training
(measured: 1e-7), and after 40 Adam steps of `flow_nll` every step's loss, the
validation loss and the trained flow's `log_prob` and samples agree to 1e-3 (measured:
at most 5.3e-4, Keras on torch). The coupled case (`flow_hidden=8`, Adam at 1e-3; the
record's `"coupled"` entry) is held to the same tolerances.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pipekit_train.core.testing import GOLDEN_FLOW_STEPS, compare_golden_flow

SETUPS = ("equinox", "lightning", "torch", "keras-jax", "keras-torch")


@pytest.fixture(scope="module")
def golden_flow(golden_outputs: Any) -> dict[str, dict]:
    """Every backend's `run_golden_flow` record (each in its own process: `golden_outputs`)."""
    return {label: json.loads(golden_outputs(label, "flow")) for label in SETUPS}


@pytest.mark.slow
@pytest.mark.parametrize("label", ["lightning", "torch", "keras-jax", "keras-torch"])
def test_flow_case_matches_equinox(golden_flow: dict[str, dict], label: str) -> None:
    problems = compare_golden_flow(golden_flow["equinox"], golden_flow[label])
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_flow_case_trains(golden_flow: dict[str, dict]) -> None:
    """Every backend records every step, and `flow_nll` really falls."""
    for label, run in golden_flow.items():
        losses = run["losses"]
        assert len(losses) == GOLDEN_FLOW_STEPS, label
        assert sum(losses[-5:]) < 0.5 * sum(losses[:5]), (label, losses[-5:])
        assert len(run["samples_initial"]) == 16 and len(run["samples_initial"][0]) == 8


@pytest.mark.slow
@pytest.mark.parametrize("label", ["lightning", "torch", "keras-jax", "keras-torch"])
def test_coupled_flow_case_matches_equinox(golden_flow: dict[str, dict], label: str) -> None:
    problems = compare_golden_flow(golden_flow["equinox"]["coupled"], golden_flow[label]["coupled"])
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_coupled_flow_case_trains(golden_flow: dict[str, dict]) -> None:
    for label, run in golden_flow.items():
        losses = run["coupled"]["losses"]
        assert len(losses) == GOLDEN_FLOW_STEPS, label
        assert sum(losses[-5:]) < 0.5 * sum(losses[:5]), (label, losses[-5:])
