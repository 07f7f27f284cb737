"""A two-process DDP run preempted by a real SIGTERM sent to one of its processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipekit_train.core.checkpoint import step_dirs

WORKER = Path(__file__).with_name("ddp_preempt_worker.py")


@pytest.mark.slow
def test_sigterm_on_one_ddp_process_stops_both_at_the_same_checkpointed_step(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), str(tmp_path)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # both ranks in one group: a hang kills them all
    )
    err = ""
    try:
        deadline = time.monotonic() + 600
        progress = tmp_path / "progress1"
        while time.monotonic() < deadline and proc.poll() is None:
            steps = progress.read_text().split() if progress.exists() else []
            if len(steps) >= 4 and (tmp_path / "pid1").exists():
                break
            time.sleep(0.01)
        assert proc.poll() is None, proc.communicate()[1][-4000:]
        sent = time.time()
        os.kill(int((tmp_path / "pid1").read_text()), signal.SIGTERM)  # rank 1 only
        _, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"The DDP worker did not finish in 600 s. Its stderr:\n{err[-4000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, err[-4000:]
    ranks = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in (0, 1)]
    stops = [r["preempted"] for r in ranks]
    assert all(s is not None for s in stops), ranks
    step = stops[0]["step"]
    assert stops[1]["step"] == step and 4 <= step < 24
    assert stops[1]["signal"] == "SIGTERM" and stops[0]["signal"] is None  # rank 0 was told
    assert stops[0]["checkpoint"] == str(tmp_path / "ckpt" / str(step))
    assert max(s["at"] for s in stops) - sent < 30
    assert step_dirs(tmp_path / "ckpt")[0] == step  # the preemption's checkpoint (then 24)
    for r in ranks:
        assert r["resumed_from_step"] == step and r["steps"] == 24
        assert r["history_steps"] == list(range(1, 25))
        assert r["sha"] == r["reference_sha"]  # same weight bytes as an uninterrupted run
    assert ranks[0]["sha"] == ranks[1]["sha"]
