"""The Ray executor: one Ray task per trial, on one local Ray runtime shared by this module."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from pipekit_train.sweep import HyperSweep, ParameterGrid, SweepResult  # noqa: E402
from pipekit_train.sweep.testing import numpy_trial  # noqa: E402

GRID = ParameterGrid({"lr": [0.003, 0.03, 0.3], "seed": [0, 1]})


# Environment of the Ray processes this module starts. Under `uv run`, Ray would start
# every worker through `uv run` again (its uv integration), which is slow and not what a
# test of the executor needs. Ray also starts several Python processes of its own; with
# PYTHONDONTWRITEBYTECODE set they recompile Ray on every start, which can exceed Ray's
# fixed 30 s raylet start-up wait on a loaded 2-core machine, so give them a bytecode cache.
RAY_ENV = {
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
    "PYTHONDONTWRITEBYTECODE": "",
    "PYTHONPYCACHEPREFIX": os.path.join(tempfile.gettempdir(), "pipekit-sweep-test-pycache"),
}


@pytest.fixture(scope="module")
def ray_runtime() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        for key, value in RAY_ENV.items():
            mp.setenv(key, value)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def _outcomes(result: SweepResult) -> list[tuple[Any, ...]]:
    return [(t.index, t.params, t.status, t.value, t.weights_sha256) for t in result]


def test_ray_sweep_matches_serial_and_records_failures(ray_runtime: None, tmp_path: Path) -> None:
    space = [*GRID, {"fail": True}]
    result = HyperSweep(
        numpy_trial, space, "val_loss", executor="ray", directory=tmp_path / "ray", sweep_id="r"
    ).run()
    serial = HyperSweep(numpy_trial, space, "val_loss", directory=tmp_path / "serial").run()
    assert _outcomes(result) == _outcomes(serial)
    assert result[6].status == "failed" and "fails on purpose" in result[6].error
    assert {t.sweep_id for t in result} == {"r"} and {
        t.summary.get("sweep_id") for t in result[:6]
    } == {"r"}
    assert ray.is_initialized()  # the sweep did not shut down a runtime it did not start


def test_ray_worker_crash_is_a_failed_trial(ray_runtime: None, tmp_path: Path) -> None:
    space = [{"lr": 0.1, "crash": True}, {"lr": 0.1}]
    result = HyperSweep(
        numpy_trial, space, "val_loss", executor="ray", max_concurrent=1, directory=tmp_path
    ).run()
    assert [t.status for t in result] == ["failed", "ok"]
    assert result[0].error
