"""Preemption of a two-process `jax.distributed` run: a signal on ONE process stops both.

`multihost_preemption_worker.py` is launched twice per phase (process 0 and 1 on
loopback, as in `scripts/multihost_equinox_smoke.py`). SIGTERM goes to process 1 only, at
a random moment of a random step: `EquinoxStepBackend.agree` carries its flag to process 0 at
the next step boundary, so both checkpoint the same step (one collective Orbax save) and
end with `Preempted`. The rerun on two processes resumes from that step and ends with the
same weight bytes and losses as an uninterrupted two-process run.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipekit_train.core import PREEMPTED_EXIT_STATUS, Checkpoint
from pipekit_train.core.checkpoint._engine import step_dirs
from pipekit_train.core.checkpoint._lease import LEASE_DIR, read_lease
from pipekit_train.core.testing import plant_lease

HERE = Path(__file__).parent
WORKER = HERE / "multihost_preemption_worker.py"
MAX_STEPS = 40
EVERY = 1000  # periodic checkpoints far apart: only the preemption writes one


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(directory: Path, mode: str) -> list[subprocess.Popen[str]]:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(i), str(port), str(directory), mode]
            + [str(MAX_STEPS), str(EVERY)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]


def _wait(procs: list[subprocess.Popen[str]], timeout: float) -> list[str]:
    """Both workers' output; kills both (and fails, with what they said) past `timeout`."""
    deadline = time.monotonic() + timeout
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outputs.append(out)
    except subprocess.TimeoutExpired:
        said = []
        for i, proc in enumerate(procs):
            proc.kill()
            out, _ = proc.communicate()
            said.append(f"--- worker {i} (exit {proc.returncode}):\n{(out or '')[-3000:]}")
        pytest.fail(f"the workers did not end within {timeout:.0f}s\n" + "\n".join(said))
    return outputs


@pytest.mark.slow  # two launches of two jax.distributed processes (~30 s of CPU)
def test_a_signal_on_one_process_preempts_both_at_the_same_step(tmp_path: Path) -> None:
    rng = random.Random(os.getpid())
    target = rng.randint(3, MAX_STEPS // 2)
    procs = _launch(tmp_path, "preempt")
    progress = tmp_path / "progress-1.txt"
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and all(p.poll() is None for p in procs):
            lines = progress.read_text().splitlines() if progress.exists() else []
            if f"step {target}" in lines:
                break
            time.sleep(0.005)
        running = [p.poll() is None for p in procs]
        assert all(running), (running, [p.communicate()[0][-3000:] for p in procs])
        # one lease for the job, held by process 0
        holder = read_lease(Checkpoint(str(tmp_path / "ckpt")))
        assert holder is not None and holder.pid == procs[0].pid, holder
        time.sleep(rng.uniform(0.0, 0.2))  # anywhere inside a step
        sent = time.monotonic()
        os.kill(procs[1].pid, signal.SIGTERM)  # one process only
        outputs = _wait(procs, 120)
        elapsed = time.monotonic() - sent
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    codes = [p.returncode for p in procs]
    assert codes == [PREEMPTED_EXIT_STATUS] * 2, (codes, [o[-3000:] for o in outputs])
    assert elapsed < 30, elapsed
    results = [json.loads((tmp_path / f"result-{i}.json").read_text()) for i in range(2)]
    step = results[0]["step"]
    assert results[1]["step"] == step, results  # both stopped at the same step
    assert target <= step < MAX_STEPS, (target, results)
    # the signalled process names its signal; the other one learnt it through agree()
    assert results[1]["signal"] == "SIGTERM" and results[0]["signal"] is None, results
    policy = Checkpoint(str(tmp_path / "ckpt"), every_n_steps=EVERY, max_to_keep=None)
    assert results[0]["checkpoint"] == results[1]["checkpoint"] == policy.step_location(step)
    assert step_dirs(policy) == [step]  # one complete checkpoint, at the step reached

    assert read_lease(policy) is None  # released at the preemption
    plant_lease(tmp_path / "held" / "ckpt", os.getpid())
    procs = _launch(tmp_path, "resume")
    outputs = _wait(procs, 300)
    assert [p.returncode for p in procs] == [0, 0], [o[-3000:] for o in outputs]
    runs = [json.loads((tmp_path / f"resumed-{i}.json").read_text()) for i in range(2)]
    for run in runs:  # a second job on a held location: refused on every process
        assert run["refused"] and f"pid {os.getpid()}" in run["refused"], run["refused"]
    assert sorted(p.name for p in (tmp_path / "held" / "ckpt").iterdir()) == [LEASE_DIR]
    for run in runs:
        resumed, reference = run["resumed"], run["reference"]
        assert resumed["resumed_from_step"] == step
        assert resumed["steps"] == reference["steps"] == MAX_STEPS
        assert resumed["weights"] == reference["weights"]  # the same weight bytes
        assert resumed["loss_steps"] == list(range(1, MAX_STEPS + 1))
        assert resumed["losses"] == reference["losses"]
    assert runs[0]["resumed"]["weights"] == runs[1]["resumed"]["weights"]
