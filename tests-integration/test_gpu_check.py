"""`scripts/gpu_check.py`: its checks run on the CPU, and it refuses to run without a GPU.

On a machine without a CUDA GPU (every test machine), `--device cpu --quick` runs the
same placement, bf16 and resume checks the GPU run makes, with small sizes, on one
backend (Equinox: the fastest to start). The `Torch(compile="cuda-graphs")` checks need
CUDA; their verdict is checked here on recorded rows (a fallback to eager or a loss gap
fails the run). Also: `benchmarks/bench_compute.py` (the compute-bound rows) at its CPU
sizes, and the offline-node scripts `scripts/gpu_bundle.sh` and `scripts/gpu_run.sh` in
their `--help` and `--dry-run` modes (no network, no GPU).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
# The children import jax afresh: let them write bytecode even where
# PYTHONDONTWRITEBYTECODE is set, as the Ray tests do for Ray's processes.
PYCACHE = {
    "PYTHONDONTWRITEBYTECODE": "",
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
    assert report["graphs"] is None and report["failed"] == []  # the verdict: exit 0
    text = md.read_text()
    assert text in proc.stdout
    assert "| equinox | jax " in text and "bit-exact ✅" in text


# -- the cuda-graphs verdict, on recorded rows ------------------------------------------------
def _graph_row(case: str, **changes: Any) -> dict[str, Any]:
    """A `graphs_check` row as `run_graphs` records it, with the K=1 numbers of one H200."""
    report = {"cuda_graphs": True, "captured_at_update": 5, "fell_back": None}
    row = {
        "case": case,
        "stop_at": 30,
        "resume_bit_exact": True,
        "resumed_from_step": 30,
        "graphed_loss": 0.726,
        "eager_loss": 0.726,
        "loss_rel_diff": 9.44e-06,
        "report": report,
    }
    report.update(changes.pop("report", {}))
    return {**row, **changes}


def test_a_graphed_run_that_fell_back_or_departs_from_eager_fails_the_check() -> None:
    """The verdict the CUDA tests use (`graphs_failures`) decides the exit status: a run
    that fell back to eager (or never captured), failed, resumed to other weights, or whose
    loss departs from eager's fails, each check named."""
    gpu_check = _gpu_check_module()
    ok_backend = {
        "backend": "lightning", "placement_ok": True, "bf16_ok": True, "resume_ok": True,
    }  # fmt: skip
    good = [_graph_row("K=1"), _graph_row("K=10")]
    assert gpu_check.failures([ok_backend], [], good) == []

    fell_back = _graph_row("K=1", report={"fell_back": "RuntimeError: capture failed"})
    gap = _graph_row("K=10", graphed_loss=0.9, loss_rel_diff=0.24)  # resume still bit-exact
    never = _graph_row("bf16-mixed", report={"captured_at_update": None})
    crashed = {"case": "K=10, accumulate 2", "error": "RuntimeError: CUDA error"}
    differs = _graph_row("K=1", resume_bit_exact=False)
    rows = [fell_back, gap, never, crashed, differs]
    failed = gpu_check.failures([ok_backend], [], rows)
    assert failed == [
        "cuda-graphs K=1: capture: fell back to eager: RuntimeError: capture failed",
        "cuda-graphs K=10: loss: graphed vs eager final loss: relative difference 0.24, "
        "not below 0.01",
        "cuda-graphs bf16-mixed: capture: never captured as a CUDA graph (compile_report: "
        "{'cuda_graphs': True, 'captured_at_update': None, 'fell_back': None})",
        "cuda-graphs K=10, accumulate 2: error: RuntimeError: CUDA error",
        "cuda-graphs K=1: resume: resumed from step 30 (expected 30), weights differ from the "
        "uninterrupted graphed run",
    ]
    # a tolerance just at the pytest GPU test's bound still fails (strictly below 1e-2)
    assert gpu_check.failures([], None, [_graph_row("K=1", loss_rel_diff=0.01)]) != []

    # the table marks the failed check of each row, and the row
    def table(rows: list[dict[str, Any]]) -> list[list[str]]:
        lines = gpu_check.graphs_table(rows)
        return [[c.strip() for c in x.strip("|").split("|")] for x in lines[2 : 2 + len(rows)]]

    [k1, k10, bf16, error, resume] = table(rows)
    assert k1[1] == "fell back to eager: RuntimeError: capture failed ❌"
    assert k1[2] == "bit-exact ✅" and k1[3].endswith("✅") and k1[4] == "❌"
    assert k10[1] == "captured at update 5 ✅" and k10[2] == "bit-exact ✅"
    assert k10[3] == "0.9 / 0.726 (0.24) ❌" and k10[4] == "❌"
    assert bf16[1] == "never captured ❌" and bf16[4] == "❌"
    assert error[0] == "K=10, accumulate 2" and error[1] == "❌ RuntimeError: CUDA error"
    assert error[4] == "❌"
    assert resume[1:] == [
        "captured at update 5 ✅", "differs (resumed from 30) ❌", "0.726 / 0.726 (9.44e-06) ✅", "❌"
    ]  # fmt: skip
    for row in table(good):
        assert row[1:] == [
            "captured at update 5 ✅", "bit-exact ✅", "0.726 / 0.726 (9.44e-06) ✅", "✅"
        ]  # fmt: skip
    assert "within 0.01 (relative) of eager's" in gpu_check.graphs_table(good)[-1]


# -- benchmarks/bench_compute.py and the offline bundle ---------------------------------------
BENCH_COMPUTE = ROOT / "benchmarks" / "bench_compute.py"
BUNDLE = ROOT / "scripts" / "gpu_bundle.sh"
RUN = ROOT / "scripts" / "gpu_run.sh"


@pytest.mark.slow
def test_bench_compute_cpu_quick_writes_rows_for_each_backend_and_loop(tmp_path: Path) -> None:
    out = tmp_path / "compute.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH_COMPUTE), "--device", "cpu", "--quick",
         "--backends", "equinox", "torch", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, **PYCACHE},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    cases = {(r["backend"], r["precision"], r["loop"]) for r in rows}
    assert cases == {
        (backend, precision, loop)
        for backend in ("equinox", "torch")
        for precision in ("float32", "bfloat16-mixed")
        for loop in ("hand", "k1", "k10")
    }  # no share-of-peak rows on the CPU
    for r in rows:
        assert r["benchmark"] == "compute" and r["unit"] == "steps/s"
        assert math.isfinite(r["value"]) and r["value"] > 0
        assert r["target"] is None and r["ok"] is None  # GPU targets: not judged on the CPU
        assert r["tflops"] > 0 and r["peak_share"] is None
        if r["loop"] != "hand":
            assert math.isfinite(r["ratio"]) and r["ratio"] > 0
    # 49,600 parameters (64→128×3→64), 6 × params × 256 rows per step
    assert "49,600 parameters" in proc.stdout and "not judged on the CPU" in proc.stdout


def test_bench_compute_refuses_boundaries_that_split_a_fused_call() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH_COMPUTE), "--device", "cpu", "--steps", "25"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--warmup and --steps must be multiples of 10" in proc.stderr
    assert "Received: --warmup 10, --steps 25." in proc.stderr


def _gpu_check_module() -> Any:
    spec = importlib.util.spec_from_file_location("pipekit_gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    return gpu_check


def test_gpu_check_runs_bench_compute_after_the_other_benchmarks() -> None:
    gpu_check = _gpu_check_module()
    names = [name for name, _, _ in gpu_check.bench_commands("cpu")]
    assert names[-1] == "bench_compute" and "bench_torch" in names
    flags = {name: flags for name, flags, _ in gpu_check.bench_commands("cuda")}
    assert flags["bench_compute"] == ["--device", "cuda"]  # the full, compute-bound sizes
    assert "bench_compute" not in [n for n, _, _ in gpu_check.bench_commands("cpu", compute=False)]


def test_gpu_check_runs_the_ensemble_rollouts_at_64_and_1024_members() -> None:
    gpu_check = _gpu_check_module()
    for device in ("cpu", "cuda"):
        flags = {name: flags for name, flags, _ in gpu_check.bench_commands(device)}
        assert flags["bench_rollout"] == [
            "--quick", "--members", "64", "1024", "--device", device
        ]  # fmt: skip


@pytest.mark.slow
def test_bench_rollout_rows_make_the_ensemble_rollout_table(tmp_path: Path) -> None:
    """bench_rollout.py on the CPU (Equinox, 64 members, a short run) writes rows that
    gpu_check's report turns into the "Ensemble rollouts" table, one line per case."""
    out = tmp_path / "rollout.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_rollout.py"), "--backends", "equinox",
         "--members", "64", "--steps", "20", "--rounds", "1", "--device", "cpu",
         "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, **PYCACHE, "JAX_PLATFORMS": "cpu"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [r["variant"] for r in rows] == ["library", "hand", "host loop"]
    gpu_check = _gpu_check_module()
    args = gpu_check.parse(["--device", "cpu", "--quick"])
    text = gpu_check.report([], rows, args, "test machine")
    lines = text.splitlines()
    at = lines.index("#### Ensemble rollouts")
    [line] = [x for x in lines[at:] if x.startswith("| equinox | 64 |")]
    cells = [c.strip() for c in line.strip("|").split("|")]
    library, hand = float(cells[2].replace(",", "")), float(cells[3].replace(",", ""))
    assert library > 0 and hand > 0
    assert float(cells[4]) == pytest.approx(rows[0]["ratio"], rel=0.01)
    assert cells[5] in ("✅", "❌")  # the 0.9x target is judged at 64 members
    # the rollout rows are not repeated in the generic benchmark table
    assert not any(x.startswith("| rollout |") for x in lines)


def _bash(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHON": sys.executable},
    )  # fmt: skip


def test_gpu_bundle_help_and_dry_run_describe_the_steps_without_network(tmp_path: Path) -> None:
    proc = _bash(str(BUNDLE), "--help")
    assert proc.returncode == 0, proc.stderr
    for text in ("scripts/build_wheels.sh", "uv.lock", "pip download", "--python-version",
                 "--platform", "--dry-run", "scripts/gpu_run.sh"):  # fmt: skip
        assert text in proc.stdout
    out = tmp_path / "bundle"
    proc = _bash(str(BUNDLE), "--dry-run", "--out", str(out), "--python-version", "3.12")
    assert proc.returncode == 0, proc.stderr
    assert not out.exists()  # nothing built, nothing downloaded
    assert "step 1: scripts/build_wheels.sh" in proc.stdout
    assert "--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64" in (
        proc.stdout
    )
    # the node's frameworks (and what they pull in) are not bundled; what the project adds is,
    # at uv.lock's versions for that Python
    wanted = proc.stdout.split("step 2:", 1)[1].splitlines()[1].split()
    names = {w.split("==")[0] for w in wanted}
    assert {"keras", "grain", "zarr", "jmp"} <= names
    assert not names & {"torch", "jax", "jaxlib", "equinox", "optax", "lightning", "numpy"}
    assert all("==" in w for w in wanted)
    proc = _bash(str(BUNDLE), "--python-version", "twelve")
    assert proc.returncode == 2 and "Received: twelve." in proc.stderr


def test_gpu_run_dry_run_names_the_install_and_the_check(tmp_path: Path) -> None:
    proc = _bash(str(RUN), "--help")
    assert proc.returncode == 0 and "--no-index --no-deps" in proc.stdout
    proc = _bash(str(RUN), "--dry-run", "--bundle", str(tmp_path / "none"), str(tmp_path / "o"),
                 "--skip-compute")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "scripts/gpu_check.py --backends equinox lightning keras-jax keras-torch" in proc.stdout
    assert f"--json {tmp_path / 'o'}/gpu-check.json --skip-compute" in proc.stdout
    proc = _bash(str(RUN), "--bundle", str(tmp_path / "none"), str(tmp_path / "o"))
    assert proc.returncode == 2 and "scripts/gpu_bundle.sh" in proc.stderr
