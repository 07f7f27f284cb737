"""The golden-run suite's field cases: one conv net on channels-last fields, every backend.

Each backend trains its own `conv_net` (same architecture, canonical initial weights from
`golden_conv_weights`) on the same `(N, H, W, C)` dataset — Lightning through
`LightningModelOp(..., layout="channels_last")`, with no permute in the model or the
data. The per-step training loss and the final validation loss must agree with Equinox's
within the case's tolerance (1e-3 relative per step).
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pipekit_train.core.testing import (
    GOLDEN_FIELD_CASES,
    GOLDEN_FIELD_STEPS,
    compare_golden,
    load_runs,
    max_differences,
)

WORKER = Path(__file__).resolve().parent / "golden_worker.py"
# label -> (backend package, KERAS_BACKEND)
SETUPS = {
    "equinox": ("equinox", None),
    "lightning": ("lightning", None),
    "keras-jax": ("keras", "jax"),
    "keras-torch": ("keras", "torch"),
}


@pytest.fixture(scope="module")
def golden_fields(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("golden_fields")

    def run(label: str) -> tuple[str, dict]:
        package, keras_backend = SETUPS[label]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        if keras_backend:
            env["KERAS_BACKEND"] = keras_backend
        path = out / f"{label}.json"
        proc = subprocess.run(
            [sys.executable, str(WORKER), package, str(path), "field"],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert proc.returncode == 0, f"{label}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        return label, load_runs(path.read_text())

    with ThreadPoolExecutor(max_workers=2) as pool:  # two processes at a time on 2 cores
        return dict(pool.map(run, SETUPS))


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
