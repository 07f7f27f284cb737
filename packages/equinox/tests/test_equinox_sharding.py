"""Sharding on a CPU-simulated 2-device mesh, and the 2-process `jax.distributed` smoke run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
ROOT = HERE.parents[2]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run(
        [sys.executable, str(HERE / "sharding_worker.py"), str(tmp_path_factory.mktemp("sharded"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.slow  # the module fixture trains in a multi-device subprocess (>10 s)
def test_data_parallel_matches_single_device(sharded: dict) -> None:
    assert sharded["devices"] == 2
    assert sharded["dp_max_loss_diff"] < 1e-5
    assert sharded["dp_val_diff"] < 1e-5
    assert sharded["model_spec"] == "()"


@pytest.mark.slow  # the module fixture trains in a multi-device subprocess (>10 s)
def test_model_sharding_and_fused_steps(sharded: dict) -> None:
    assert sharded["ms_max_loss_diff"] < 1e-5
    assert "('data',)" in sharded["ms_specs"]
    # adam's moments follow their parameters
    assert "('data',)" in sharded["ms_opt_specs"]


@pytest.mark.slow  # the module fixture trains in a multi-device subprocess (>10 s)
def test_sharded_checkpoint_resumes_exactly(sharded: dict) -> None:
    assert sharded["resumed_from_step"] == 20
    assert sharded["resume_bytes_equal"]


@pytest.mark.slow  # the module fixture trains in a multi-device subprocess (>10 s)
def test_spec_validation(sharded: dict) -> None:
    errors = sharded["errors"]
    assert "'batch'" in errors["axis"] and "Received" in errors["axis"]
    assert "batch_size" in errors["divisible"] and "Received: batch_size=15" in errors["divisible"]
    assert "Mesh" in errors["mesh"]


@pytest.mark.slow
def test_multihost_smoke_and_elastic_resume() -> None:
    """Two `jax.distributed` processes on loopback train, checkpoint and resume in step;
    a 1-process checkpoint resumes on 2 processes and a 2-process one on 1 (elastic).

    One launch (the launcher trains the 1-process runs itself): about 40 s of CPU time
    in all processes together; the 300 s limit leaves room for a busy machine, and
    running past it fails the test (a hang in `jax.distributed` is a bug, not a skip).
    """
    script = ROOT / "scripts" / "multihost_equinox_smoke.py"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run(
        [sys.executable, str(script), "--timeout", "300", "--elastic"],
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "FAIL" not in proc.stdout
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    report = json.loads(lines[-1][len("RESULT ") :])
    checks = report["checks"]
    # the global sample sequence after a resume on another process count is the
    # uninterrupted run's, step by step (the recorded sample indices of every process)
    assert checks["1 -> 2 processes: the same global sample sequence"]
    assert checks["2 -> 1 processes: the same global sample sequence"]
    assert checks["the global sample order is the same on 1 and 2 processes"]
    assert checks["a 2-process checkpoint restores bit-exactly on 1 process"]
    assert all(checks.values()), checks
    # what is not bit-exact: cross-device reductions round differently (float32 ulps)
    diffs = report["max_abs_weight_diff"]
    assert set(diffs) >= {"resume_1_to_2_vs_reference_1", "resume_2_to_1_vs_reference_2"}
    assert max(diffs.values()) < 1e-5, diffs
    assert report["max_abs_loss_diff"] < 1e-5
