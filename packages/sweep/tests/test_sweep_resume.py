"""A sweep killed with SIGKILL half-way resumes: finished trials are not run again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pipekit_train.core.checkpoint import read_lease
from pipekit_train.sweep import HyperSweep, ParameterGrid, SweepResult
from pipekit_train.sweep._journal import params_key

GRID_SPEC = {"lr": [0.003, 0.03, 0.3], "seed": [0, 1], "checkpoint_every": [10]}
GRID = ParameterGrid(GRID_SPEC)
KILL_AFTER = 3  # trials finished before the kill; the 4th is killed mid-training

TRIALS_MODULE = '''
"""Trial wrapper: logs each call; with KILL_AFTER_TRIALS set, SIGKILLs its own process
at step 25 of the first trial that starts once the journal holds that many trials."""
import dataclasses, os, signal
from pipekit_train.core.callbacks import LambdaCallback
from pipekit_train.sweep.testing import numpy_trial


def trial(params, *, trial_dir):
    sweep_dir = trial_dir.parent.parent
    with open(sweep_dir / "calls.log", "a") as fh:
        fh.write(trial_dir.name + "\\n")
    loop = numpy_trial(params, trial_dir=trial_dir)
    # synchronous saves, so the checkpoint at step 20 is on disk when the kill comes
    loop.plan = dataclasses.replace(loop.plan, checkpoint=dataclasses.replace(loop.plan.checkpoint, async_save=False))
    kill_after = int(os.environ.get("KILL_AFTER_TRIALS", "-1"))
    journal = sweep_dir / "journal.jsonl"
    finished = len(journal.read_text().splitlines()) if journal.exists() else 0
    if 0 <= kill_after <= finished:
        def die(state):
            if state.step >= 25:
                os.kill(os.getpid(), signal.SIGKILL)
        loop.plan = dataclasses.replace(loop.plan, callbacks=(*loop.plan.callbacks, LambdaCallback(on_step_end=die)))
    return loop
'''

RUNNER = """
import sys
from pipekit_train.sweep import HyperSweep, ParameterGrid
grid = ParameterGrid({grid!r})
HyperSweep("sweep_kill_trials:trial", grid, "val_loss", directory=sys.argv[1]).run()
print("the sweep was not killed")
"""


def _outcomes(result: SweepResult) -> list[tuple[Any, ...]]:
    return [
        (t.index, t.params, t.status, t.value, t.weights_sha256, t.summary["steps"]) for t in result
    ]


def _calls(directory: Path) -> list[str]:
    path = directory / "calls.log"
    return path.read_text().split() if path.exists() else []


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_sigkilled_sweep_resumes_and_ends_like_an_uninterrupted_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sweep_kill_trials.py").write_text(TRIALS_MODULE)
    (tmp_path / "runner.py").write_text(textwrap.dedent(RUNNER.format(grid=GRID_SPEC)))
    killed = tmp_path / "killed"
    env = {**os.environ, "KILL_AFTER_TRIALS": str(KILL_AFTER), "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "runner.py"), str(killed)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    journal = killed / "journal.jsonl"
    assert len(journal.read_text().splitlines()) == KILL_AFTER
    keys = [params_key(p) for p in GRID]
    assert _calls(killed) == keys[: KILL_AFTER + 1]  # the 4th trial was running when killed
    # the killed trial left checkpoints (steps 10, 20) in its own folder, and the lease of
    # the killed process, which the resumed sweep (same host, dead pid) takes over
    trial_checkpoints = killed / "trials" / keys[KILL_AFTER] / "checkpoints"
    assert sorted(p.name for p in trial_checkpoints.iterdir()) == [
        ".pipekit-lease",
        "10",
        "20",
    ]
    assert read_lease(trial_checkpoints) is not None
    with open(journal, "ab") as fh:  # and, for good measure, a torn journal line
        fh.write(b'{"key": "' + keys[KILL_AFTER].encode() + b'", "status": "ok", "val')

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("KILL_AFTER_TRIALS", raising=False)
    resumed = HyperSweep("sweep_kill_trials:trial", GRID, "val_loss", directory=killed).run()
    assert _calls(killed)[KILL_AFTER + 1 :] == keys[KILL_AFTER:]  # only the rest ran
    assert [t.from_journal for t in resumed] == [True] * KILL_AFTER + [False] * (
        len(GRID) - KILL_AFTER
    )
    assert resumed[KILL_AFTER].summary["resumed_from_step"] == 20  # from the trial's own checkpoint
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [line["key"] for line in lines] == keys
    assert read_lease(trial_checkpoints) is None  # released when the resumed trial ended

    clean = HyperSweep(
        "sweep_kill_trials:trial", GRID, "val_loss", directory=tmp_path / "clean"
    ).run()
    assert _outcomes(resumed) == _outcomes(clean)
    assert resumed.best.params == clean.best.params
    assert resumed.sweep_id != clean.sweep_id and {t.sweep_id for t in resumed} == {
        resumed.sweep_id
    }
