"""Workers die with their sweep, and a trial directory has one writer at a time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from pipekit_train.sweep import TrialDirectoryInUseError
from pipekit_train.sweep._executors import execute_trial
from pipekit_train.sweep._lock import LOCK_NAME, read_owner, trial_dir_lock

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

SWEEP = """
import sys
from pipekit_train.sweep import HyperSweep

if __name__ == "__main__":
    HyperSweep(
        "pipekit_train.sweep.testing:numpy_trial",
        [{"sleep": 120.0, "seed": 0}, {"sleep": 120.0, "seed": 1}],
        "val_loss",
        executor="process",
        max_concurrent=2,
        directory=sys.argv[1],
    ).run()
"""

RAY_SWEEP = SWEEP.replace('executor="process"', 'executor="ray"')

HOLDER = """
import sys, time
from pipekit_train.sweep._lock import trial_dir_lock

with trial_dir_lock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _kill_sweep_and_check_workers(tmp_path: Path, source: str, env: dict | None = None) -> None:
    script = tmp_path / "sweep_main.py"
    script.write_text(source)
    directory = tmp_path / "sweep"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(directory)],
        cwd=tmp_path,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def running_trials() -> list[int]:
            owners = [read_owner(p.parent) for p in directory.glob(f"trials/*/{LOCK_NAME}")]
            pids = [o["pid"] for o in owners if o and o.get("pid")]
            return pids if len(pids) == 2 else []

        # Both trials are running (each worker owns its trial directory, then sleeps).
        workers = _wait_for(running_trials, 180, "two running trials")
        assert proc.poll() is None and proc.pid not in workers
        descendants = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        assert set(workers) <= set(descendants)

        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        killed_at = time.monotonic()
        _wait_for(lambda: not any(_alive(pid) for pid in workers), 5.0, "the workers to exit")
        assert time.monotonic() - killed_at < 5.0
        if env is None:  # the process executor leaves nothing at all behind
            _wait_for(lambda: not any(_alive(pid) for pid in descendants), 5.0, "every descendant")
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in locals().get("descendants", []):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_killing_a_process_sweep_leaves_no_worker_alive(tmp_path: Path) -> None:
    _kill_sweep_and_check_workers(tmp_path, SWEEP)


@pytest.mark.slow
def test_killing_a_ray_sweep_ends_its_trial_workers(tmp_path: Path) -> None:
    """Ray's own fate sharing: the driver's local raylet dies with it, and its workers too.

    (Ray's dashboard and runtime-env agents outlive the driver by about a minute; they do
    not write trial directories.) Starts a local Ray runtime: 10-12 s on 2 cores; this
    file is in the root conftest's `RAY_FILES`, so no other Ray runtime runs beside it.
    """
    pytest.importorskip("ray")
    env = {
        "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
        "PYTHONDONTWRITEBYTECODE": "",
    }
    _kill_sweep_and_check_workers(tmp_path, RAY_SWEEP, env)


def test_a_live_owner_blocks_a_second_writer_and_a_dead_one_is_taken_over(
    tmp_path: Path,
) -> None:
    trial_dir = tmp_path / "trials" / "00000-abc"
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLDER), str(trial_dir)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(TrialDirectoryInUseError, match=f"pid={holder.pid}") as info:
            with trial_dir_lock(trial_dir):
                pass
        assert f"Received: trial_dir={str(trial_dir)!r}" in str(info.value)

        # A sweep worker given that trial fails it with the same error, before training.
        outcome = execute_trial(
            {
                "trial": "pipekit_train.sweep.testing:numpy_trial",
                "params": {"max_steps": 2},
                "trial_dir": str(trial_dir),
                "sweep_id": "s",
            }
        )
        assert outcome["status"] == "failed"
        assert outcome["error"].startswith("TrialDirectoryInUseError:")
        assert sorted(p.name for p in trial_dir.iterdir()) == [LOCK_NAME, f"{LOCK_NAME}.owner.json"]
    finally:
        holder.kill()
        holder.wait(timeout=10)

    # The owner died (SIGKILL: it released nothing itself): its lock is taken over.
    with trial_dir_lock(trial_dir):
        assert read_owner(trial_dir)["pid"] == os.getpid()
        with pytest.raises(TrialDirectoryInUseError):  # one writer, even in one process
            with trial_dir_lock(trial_dir):
                pass
    outcome = execute_trial(
        {
            "trial": "pipekit_train.sweep.testing:numpy_trial",
            "params": {"max_steps": 2, "validate_every": 1},
            "trial_dir": str(trial_dir),
            "sweep_id": "s",
        }
    )
    assert outcome["status"] == "ok", outcome["error"]
    assert json.loads((trial_dir / f"{LOCK_NAME}.owner.json").read_text())["pid"] == os.getpid()
