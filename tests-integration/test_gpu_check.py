"""`scripts/gpu_check.py`: its checks run on the CPU, and it refuses to run without a GPU.

On a machine without a CUDA GPU (every test machine), `--device cpu --quick` runs the
same placement, bf16 and resume checks the GPU run makes, with small sizes, on one
backend (Equinox: the fastest to start).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
# The children import jax afresh: give them a bytecode cache even where
# PYTHONDONTWRITEBYTECODE is set, as the Ray tests do for Ray's processes.
PYCACHE = {
    "PYTHONDONTWRITEBYTECODE": "",
    "PYTHONPYCACHEPREFIX": os.path.join(tempfile.gettempdir(), "pipekit-gpu-check-pycache"),
}


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **PYCACHE, **(env or {})},
    )


def test_without_a_cuda_gpu_it_stops_with_status_2_and_says_why() -> None:
    # CUDA_VISIBLE_DEVICES="" hides any GPU, so this holds on a GPU machine too.
    proc = _run("--skip-bench", env={"CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 2, proc.stderr
    assert "gpu_check: no CUDA GPU" in proc.stderr
    assert "uv run --group gpu python scripts/gpu_check.py" in proc.stderr
    assert "--device cpu --quick" in proc.stderr
    assert proc.stdout == ""  # nothing was trained


def test_bad_arguments_are_refused_before_any_work() -> None:
    proc = _run("--device", "cpu", "--steps", "10", "--stop-at", "10")
    assert proc.returncode == 2
    assert "--stop-at must be between 1 and --steps - 1. Received: --stop-at 10, --steps 10." in (
        proc.stderr
    )
    proc = _run("--device", "cpu", "--backends", "tensorflow")
    assert proc.returncode == 2 and "invalid choice: 'tensorflow'" in proc.stderr


@pytest.mark.slow
def test_cpu_quick_run_checks_placement_bf16_and_resume(tmp_path: Path) -> None:
    out, md = tmp_path / "check.json", tmp_path / "check.md"
    proc = _run(
        "--device", "cpu", "--quick", "--backends", "equinox", "--skip-bench",
        "--json", str(out), "--output", str(md),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    [eqx] = report["backends"]
    assert eqx["backend"] == "equinox" and eqx["framework_device"].endswith("(cpu)")
    assert eqx["placement"] == ["cpu"] and eqx["placement_ok"]
    # Resume: stopped after 10 of 20 steps and resumed, bit-exact with the uninterrupted run.
    assert eqx["resumed_from_step"] == 10
    assert eqx["resume_bit_exact"] and eqx["resume_max_abs_diff"] == 0.0 and eqx["resume_ok"]
    assert eqx["repeat_bit_exact"]
    # bf16-mixed trains and is not float32 in disguise.
    assert eqx["bf16_ok"] and 0 < eqx["bf16_rel_diff"] < 0.25
    assert "compute=bfloat16" in eqx["bf16_evidence"]
    assert report["benchmarks"] is None  # --skip-bench
    text = md.read_text()
    assert text in proc.stdout
    assert "| equinox | jax " in text and "bit-exact ✅" in text
