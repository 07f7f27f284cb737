"""The golden-run suite's field cases: one conv net on channels-last fields, every backend.

Each backend trains its own `conv_net` (same architecture, canonical initial weights from
`golden_conv_weights`) on the same `(N, H, W, C)` dataset — Lightning through
`LightningModelOp(..., layout="channels_last")`, with no permute in the model or the
data. The per-step training loss and the final validation loss must agree with Equinox's
within the case's tolerance (1e-3 relative per step).
"""

from __future__ import annotations

from typing import Any

import pytest

from pipekit_train.core.testing import (
    GOLDEN_FIELD_CASES,
    GOLDEN_FIELD_STEPS,
    compare_golden,
    load_runs,
    max_differences,
)

# label -> (backend package, KERAS_BACKEND)
SETUPS = {
    "equinox": ("equinox", None),
    "lightning": ("lightning", None),
    "keras-jax": ("keras", "jax"),
    "keras-torch": ("keras", "torch"),
}


@pytest.fixture(scope="module")
def golden_fields(golden_outputs: Any) -> dict[str, dict]:
    """Every backend's `run_golden_field` runs (each in its own process: `golden_outputs`)."""
    return {label: load_runs(golden_outputs(label, "field")) for label in SETUPS}


@pytest.mark.slow
@pytest.mark.parametrize("label", ["lightning", "keras-jax", "keras-torch"])
def test_field_cases_match_equinox(golden_fields: dict[str, dict], label: str) -> None:
    problems = compare_golden(golden_fields["equinox"], golden_fields[label], GOLDEN_FIELD_CASES)
    table = "\n".join(
        f"{case:40s} step {a:.1e}  val {b:.1e}"
        for case, (a, b) in max_differences(golden_fields["equinox"], golden_fields[label]).items()
    )
    assert not problems, "\n".join(problems) + "\n" + table


@pytest.mark.slow
def test_field_cases_train(golden_fields: dict[str, dict]) -> None:
    """Every backend records every step, and the conv net really learns the field map."""
    for label, runs in golden_fields.items():
        for case in GOLDEN_FIELD_CASES:
            losses = runs[case.name].losses
            assert len(losses) == GOLDEN_FIELD_STEPS, (label, case.name)
            assert sum(losses[-5:]) < 0.5 * sum(losses[:5]), (label, case.name, losses[-5:])
