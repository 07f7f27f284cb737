"""The same `HyperSweep` code drives Equinox, Lightning and Keras trials.

Each test runs a 4-trial grid (`lr` x `seed`) of the core toy regression task on one
backend, with `pipekit_train.sweep.testing:backend_trial` building each trial's
`TrainingLoop` from the backend's `testing:linear` model. A backend is skipped only when
its package is not installed; when installed, its sweep must pass. Keras picks its
backend at import, so its sweep runs in a subprocess with `KERAS_BACKEND=jax`.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pipekit_train.sweep import HyperSweep, ParameterGrid, SweepResult

GRID = {"lr": [0.01, 0.05], "seed": [0, 1]}


def _grid(backend: str) -> ParameterGrid:
    return ParameterGrid({"backend": [backend], **GRID, "max_steps": [60]})


def _check(result: SweepResult | dict[str, Any], backend: str, sweep_id: str) -> None:
    data = result.to_json() if isinstance(result, SweepResult) else result
    trials = data["trials"]
    assert data["sweep_id"] == sweep_id
    assert [(t["params"]["lr"], t["params"]["seed"]) for t in trials] == [
        (0.01, 0),
        (0.01, 1),
        (0.05, 0),
        (0.05, 1),
    ]
    for t in trials:
        assert t["status"] == "ok", t["error"]
        assert t["sweep_id"] == sweep_id and t["summary"]["sweep_id"] == sweep_id
        assert t["summary"]["backend"] == backend and t["summary"]["steps"] == 60
        assert math.isfinite(t["value"]) and t["value"] == t["summary"]["final_metrics"]["val_loss"]
        assert len(t["summary"]["weights_sha256"]) == 64
    # a larger learning rate trains the toy task further in 60 steps
    by_lr = {lr: min(t["value"] for t in trials if t["params"]["lr"] == lr) for lr in GRID["lr"]}
    assert by_lr[0.05] < by_lr[0.01]


def test_equinox_sweep(tmp_path: Path) -> None:
    pytest.importorskip("pipekit_train.equinox")
    result = HyperSweep(
        "pipekit_train.sweep.testing:backend_trial",
        _grid("equinox"),
        "val_loss",
        directory=tmp_path,
        sweep_id="eqx-sweep",
    ).run()
    _check(result, "equinox", "eqx-sweep")
    for t in result:
        assert t.artifact.sweep_id == "eqx-sweep" and t.artifact.plan["sweep_id"] == "eqx-sweep"
    assert result.best.params["lr"] == 0.05


@pytest.mark.slow
def test_equinox_sweep_in_worker_processes(tmp_path: Path) -> None:
    pytest.importorskip("pipekit_train.equinox")
    serial = HyperSweep(
        "pipekit_train.sweep.testing:backend_trial",
        _grid("equinox"),
        "val_loss",
        directory=tmp_path / "serial",
    ).run()
    parallel = HyperSweep(
        "pipekit_train.sweep.testing:backend_trial",
        _grid("equinox"),
        "val_loss",
        executor="process",
        max_concurrent=2,
        directory=tmp_path / "process",
        sweep_id="eqx-proc",
    ).run()
    _check(parallel, "equinox", "eqx-proc")
    # each trial is deterministic, wherever it runs
    assert [t.weights_sha256 for t in parallel] == [t.weights_sha256 for t in serial]


def test_lightning_sweep(tmp_path: Path) -> None:
    pytest.importorskip("pipekit_train.lightning")
    result = HyperSweep(
        "pipekit_train.sweep.testing:backend_trial",
        _grid("lightning"),
        "val_loss",
        directory=tmp_path,
        sweep_id="pl-sweep",
    ).run()
    _check(result, "lightning", "pl-sweep")
    assert all(t.artifact.sweep_id == "pl-sweep" for t in result)


KERAS_SCRIPT = """
import json, sys
from pipekit_train.sweep import HyperSweep, ParameterGrid
grid = ParameterGrid(json.loads(sys.argv[2]))
result = HyperSweep("pipekit_train.sweep.testing:backend_trial", grid, "val_loss",
                    directory=sys.argv[1], sweep_id="keras-sweep").run()
assert all(t.artifact.sweep_id == "keras-sweep" for t in result if t.status == "ok")
print("RESULT " + json.dumps(result.to_json()))
"""


@pytest.mark.slow
def test_keras_sweep_on_jax(tmp_path: Path) -> None:
    # Only look the packages up: importing keras here would fix its backend for this process.
    for name in ("keras", "jax", "pipekit_train.keras"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed")
    script = tmp_path / "keras_sweep.py"
    script.write_text(textwrap.dedent(KERAS_SCRIPT))
    grid = {"backend": ["keras"], **GRID, "max_steps": [60]}
    env = {**os.environ, "KERAS_BACKEND": "jax"}
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "sweep"), json.dumps(grid)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    _check(json.loads(line[len("RESULT ") :]), "keras", "keras-sweep")
