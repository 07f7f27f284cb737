"""A simulated SLURM job: two `jax.distributed` processes configured by SLURM's variables.

The test sets what `srun` sets for a two-task job step on one node (`SLURM_JOB_ID`,
`SLURM_STEP_NODELIST`, `SLURM_NTASKS`, `SLURM_PROCID`, `SLURM_LOCALID`, ...) and each
worker calls `jax.distributed.initialize()` without arguments: jax's SLURM detection
takes the coordinator (the node list's first host, a port derived from the job id), the
process count and the process id from them. SIGTERM to both tasks (what
`sbatch --signal=TERM@120` or a preemption sends) stops the job at one checkpointed step;
started again with the same `SLURM_JOB_ID` (a requeue), it continues exactly.
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
from pipekit_train.core.checkpoint import read_lease, step_dirs
from pipekit_train.core.testing import plant_lease

WORKER = Path(__file__).with_name("multihost_preemption_worker.py")
MAX_STEPS, EVERY = 30, 1000  # only the preemption writes a checkpoint


def _slurm_job_id() -> int:
    """A job id whose jax coordinator port (61440 + id % 4096) binds now."""
    start = random.Random().randrange(4096)
    for offset in range(4096):
        port = 61440 + (start + offset) % 4096
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return 4096 * 7 + port - 61440
    raise RuntimeError("no free port in jax's SLURM range 61440-65535")


def _launch(directory: Path, mode: str, job_id: int) -> list[subprocess.Popen[str]]:
    base = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS" and not k.startswith("SLURM")}
    slurm = {
        "SLURM_JOB_ID": str(job_id),
        "SLURM_STEP_NODELIST": "127.0.0.1",
        "SLURM_NTASKS": "2",
        "SLURM_STEP_NUM_NODES": "1",
        "SLURM_NNODES": "1",
    }
    return [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(i), "0", str(directory), mode]
            + [str(MAX_STEPS), str(EVERY)],
            env={**base, **slurm, "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]


def _wait(procs: list[subprocess.Popen[str]], timeout: float) -> list[str]:
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
            said.append(f"--- task {i} (exit {proc.returncode}):\n{(out or '')[-3000:]}")
        pytest.fail(f"the tasks did not end within {timeout:.0f}s\n" + "\n".join(said))
    return outputs


@pytest.mark.slow  # two launches of two jax.distributed processes (~30 s of CPU)
def test_a_sigtermed_slurm_job_requeued_with_its_job_id_continues_exactly(tmp_path: Path) -> None:
    job_id = _slurm_job_id()
    procs = _launch(tmp_path, "preempt", job_id)
    progress = tmp_path / "progress-1.txt"
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and all(p.poll() is None for p in procs):
            lines = progress.read_text().splitlines() if progress.exists() else []
            if "step 6" in lines:
                break
            time.sleep(0.01)
        assert all(p.poll() is None for p in procs), [p.communicate()[0][-3000:] for p in procs]
        holder = read_lease(Checkpoint(str(tmp_path / "ckpt")))
        assert holder is not None and holder.job == f"slurm:{job_id}.batch", holder
        for p in procs:  # SLURM signals every task of the step
            os.kill(p.pid, signal.SIGTERM)
        outputs = _wait(procs, 120)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    codes = [p.returncode for p in procs]
    assert codes == [PREEMPTED_EXIT_STATUS] * 2, (codes, [o[-3000:] for o in outputs])
    results = [json.loads((tmp_path / f"result-{i}.json").read_text()) for i in range(2)]
    step = results[0]["step"]
    assert results[1]["step"] == step and 6 <= step < MAX_STEPS, results
    assert step_dirs(tmp_path / "ckpt") == [step]

    plant_lease(tmp_path / "held" / "ckpt", os.getpid())  # another, live job's location
    procs = _launch(tmp_path, "resume", job_id)  # the requeued job: same SLURM_JOB_ID
    outputs = _wait(procs, 300)
    assert [p.returncode for p in procs] == [0, 0], [o[-3000:] for o in outputs]
    runs = [json.loads((tmp_path / f"resumed-{i}.json").read_text()) for i in range(2)]
    for run in runs:
        assert run["refused"], run  # the other job's location stays refused
        resumed, reference = run["resumed"], run["reference"]
        assert resumed["resumed_from_step"] == step
        assert resumed["steps"] == reference["steps"] == MAX_STEPS
        assert resumed["weights"] == reference["weights"]
        assert resumed["losses"] == reference["losses"]
    assert runs[0]["resumed"]["weights"] == runs[1]["resumed"]["weights"]
