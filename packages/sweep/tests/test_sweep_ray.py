"""The Ray executor on a simulated two-node Ray cluster shared by this module.

`ray.cluster_utils.Cluster` starts a head node and a second node on this machine, each
declaring one GPU (Ray schedules by the declared resources; no GPU is needed), and the
second a custom resource `bigmem`. Plain trials run anywhere; trials with resources run
where those resources are free, as many at once as the nodes hold.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from pipekit_train.core import ConfigError  # noqa: E402
from pipekit_train.sweep import HyperSweep, ParameterGrid, RayExecutor, SweepResult  # noqa: E402
from pipekit_train.sweep.testing import (  # noqa: E402
    most_at_once,
    numpy_trial,
    placement_trial,
    read_placements,
)

GRID = ParameterGrid({"lr": [0.003, 0.03, 0.3], "seed": [0, 1]})
HALF_GPU = {"num_cpus": 0.25, "num_gpus": 0.5}  # the GPU, not the CPUs, limits these trials


# Environment of the Ray processes this module starts. Under `uv run`, Ray would start
# every worker through `uv run` again (its uv integration), which is slow and not what a
# test of the executor needs. Ray also starts several Python processes of its own; with
# PYTHONDONTWRITEBYTECODE set they recompile Ray on every start, which can exceed Ray's
# fixed 30 s raylet start-up wait on a loaded 2-core machine, so let them write bytecode
# (into the environment's own `__pycache__`, which every other process of the run reads:
# a separate PYTHONPYCACHEPREFIX would start cold on every fresh clone).
RAY_ENV = {
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
    "PYTHONDONTWRITEBYTECODE": "",
}


@dataclasses.dataclass
class SimulatedCluster:
    address: str
    head: str  # node ids
    second: str


@pytest.fixture(scope="module")
def cluster() -> Iterator[SimulatedCluster]:
    with pytest.MonkeyPatch.context() as mp:
        for key, value in RAY_ENV.items():
            mp.setenv(key, value)
        sim = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 2, "num_gpus": 1, "include_dashboard": False},
        )
        second = sim.add_node(num_cpus=2, num_gpus=1, resources={"bigmem": 2})
        ray.init(address=sim.address, log_to_driver=False)
        sim.wait_for_nodes()
    try:
        yield SimulatedCluster(sim.address, sim.head_node.node_id, second.node_id)
    finally:
        ray.shutdown()
        sim.shutdown()


def _outcomes(result: SweepResult) -> list[tuple[Any, ...]]:
    return [(t.index, t.params, t.status, t.value, t.weights_sha256) for t in result]


@pytest.mark.slow
def test_ray_sweep_matches_serial_and_records_failures(
    cluster: SimulatedCluster, tmp_path: Path
) -> None:
    space = [*GRID, {"fail": True}]
    result = HyperSweep(
        numpy_trial,
        space,
        "val_loss",
        executor="ray",
        max_concurrent=2,  # two worker processes are enough here (and cheap on 2 cores)
        directory=tmp_path / "ray",
        sweep_id="r",
    ).run()
    serial = HyperSweep(numpy_trial, space, "val_loss", directory=tmp_path / "serial").run()
    assert _outcomes(result) == _outcomes(serial)
    assert result[6].status == "failed" and "fails on purpose" in result[6].error
    assert {t.sweep_id for t in result} == {"r"} and {
        t.summary.get("sweep_id") for t in result[:6]
    } == {"r"}
    assert ray.is_initialized()  # the sweep did not shut down a runtime it did not start


@pytest.mark.slow  # the module's simulated Ray cluster takes >10 s to start
def test_ray_worker_crash_is_a_failed_trial(cluster: SimulatedCluster, tmp_path: Path) -> None:
    space = [{"lr": 0.1, "crash": True}, {"lr": 0.1}]
    result = HyperSweep(
        numpy_trial, space, "val_loss", executor="ray", max_concurrent=1, directory=tmp_path
    ).run()
    assert [t.status for t in result] == ["failed", "ok"]
    assert result[0].error


def _by_node(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        out.setdefault(rec["node_id"], []).append(rec)
    return out


@pytest.mark.slow
def test_half_gpu_trials_run_two_per_gpu_on_every_gpu_node(
    cluster: SimulatedCluster, tmp_path: Path
) -> None:
    executor = RayExecutor(HALF_GPU)
    executor.start()  # by default, as many in flight as fit: 2 nodes x 2 trials per GPU
    assert executor.max_concurrent == 4
    executor.close()
    assert ray.is_initialized()

    records = tmp_path / "placements"
    # 6 trials, all handed to Ray at once: Ray itself must hold back the 2 that do not fit.
    # The first four wait until two trials run on their GPU, so two at once can be seen;
    # the last two (queued, with no partner to wait for) run straight through.
    space = [
        {"record_dir": str(records), "peers": 2 if i < 4 else 1, "wait_s": 60.0, "seed": i}
        for i in range(6)
    ]
    result = HyperSweep(
        placement_trial, space, "val_loss", executor=executor, max_concurrent=6, directory=tmp_path
    ).run()
    assert [t.status for t in result] == ["ok"] * 6
    placements = read_placements(records)
    assert len(placements) == 6
    by_node = _by_node(placements)
    assert sorted(by_node) == sorted([cluster.head, cluster.second])  # spread over both nodes
    for recs in by_node.values():
        assert max(r["max_running"] for r in recs) == 2  # two trials shared the GPU ...
        assert most_at_once(recs) == 2  # ... and never more than two, by the recorded times
    for rec in placements:  # what a trial with half a GPU sees
        assert rec["gpu_ids"] == ["0"]
        assert rec["env"]["CUDA_VISIBLE_DEVICES"] == "0"
        assert rec["env"]["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.375"  # half of JAX's 0.75
        assert rec["env"]["OMP_NUM_THREADS"] == "1"  # Ray: the CPUs asked for, at least 1
    assert len({r["pid"] for r in placements}) == 6  # Ray starts a fresh worker per GPU task


@pytest.mark.slow
def test_custom_resources_place_trials_on_the_nodes_that_have_them(
    cluster: SimulatedCluster, tmp_path: Path
) -> None:
    records = tmp_path / "placements"
    space = [{"record_dir": str(records), "peers": 2, "wait_s": 60.0, "seed": i} for i in range(2)]
    executor = RayExecutor({"num_cpus": 0.25, "resources": {"bigmem": 1}})
    executor.start()
    assert executor.max_concurrent == 2  # the second node's bigmem=2
    executor.close()
    result = HyperSweep(
        placement_trial, space, "val_loss", executor=executor, directory=tmp_path
    ).run()
    assert [t.status for t in result] == ["ok"] * 2
    placements = read_placements(records)
    assert {r["node_id"] for r in placements} == {cluster.second}  # the only `bigmem` node
    assert max(r["max_running"] for r in placements) == 2 == most_at_once(placements)
    for rec in placements:  # no GPU asked for: none assigned, CUDA_VISIBLE_DEVICES untouched
        assert rec["gpu_ids"] == []
        assert rec["env"]["CUDA_VISIBLE_DEVICES"] == os.environ.get("CUDA_VISIBLE_DEVICES")
        assert rec["env"]["XLA_PYTHON_CLIENT_MEM_FRACTION"] is None


@pytest.mark.slow  # the module's simulated Ray cluster takes >10 s to start
def test_a_request_no_node_meets_is_refused_before_any_trial(
    cluster: SimulatedCluster, tmp_path: Path
) -> None:
    sweep = HyperSweep(
        numpy_trial, [{}], "val_loss", executor=RayExecutor({"num_gpus": 2}), directory=tmp_path
    )
    with pytest.raises(ConfigError, match=r"No node of the Ray cluster can run a trial") as info:
        sweep.run()
    assert "'num_gpus': 2" in str(info.value) and "'GPU': 1.0" in str(info.value)
    assert not (tmp_path / "sweep.json").exists() and not (tmp_path / "trials").exists()
    assert ray.is_initialized()


DRIVER = """
import sys
from pipekit_train.sweep import HyperSweep, RayExecutor

if __name__ == "__main__":
    directory, records, address = sys.argv[1:4]
    HyperSweep(
        "pipekit_train.sweep.testing:placement_trial",
        [{"record_dir": records, "peers": 99, "wait_s": 300.0, "seed": i} for i in range(2)],
        "val_loss",
        executor=RayExecutor({"num_cpus": 0.25, "num_gpus": 1}, address=address),
        directory=directory,
    ).run()
"""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.slow
def test_killing_a_driver_ends_its_trials_on_every_node(
    cluster: SimulatedCluster, tmp_path: Path
) -> None:
    """The lifeline with resources: a killed sweep driver leaves no trial running.

    The driver connects to the cluster (as a sweep on a real cluster does) and starts
    two one-GPU trials, one on each node, which wait for peers that never come.
    """
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    records = tmp_path / "placements"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "sweep"), str(records), cluster.address],
        env={**os.environ, **RAY_ENV},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    workers: list[int] = []
    try:

        def running() -> list[int]:
            import json

            pids = [json.loads(p.read_text())["pid"] for p in records.glob("running/*/*")]
            return pids if len(pids) == 2 else []

        workers = _wait_for(running, 120, "two running trials")
        assert len(list(records.glob("running/*"))) == 2  # two groups: one GPU on each node
        assert all(_alive(pid) for pid in workers)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        killed_at = time.monotonic()
        _wait_for(lambda: not any(_alive(pid) for pid in workers), 30, "the trials to end")
        assert time.monotonic() - killed_at < 30
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
