"""`TrainingArtifact.summary()` says how the run went: fresh, resumed, or nothing left to do."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pipekit_train.core import Checkpoint, TrainingLoop
from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp, regression_task


def _run(tmp_path: Path, max_steps: int) -> Any:
    train, val = regression_task(n_train=128, in_size=2)
    return TrainingLoop(
        model=NumpyLinearOp("pipekit_train.core.testing:linear", in_size=2, out_size=1),
        data=train,
        validation=val,
        loss="mse",
        optimizer_config={"name": "adam", "lr": 0.05},
        batch_size=16,
        max_steps=max_steps,
        checkpoint=Checkpoint(tmp_path / "ckpt", every_n_steps=10, async_save=False),
        adapter=NumpyAdapter(),
        progress=False,
    ).run()


def test_fresh_resumed_and_finished_runs_each_say_what_happened(tmp_path: Path) -> None:
    fresh = _run(tmp_path, 20)
    assert fresh.resumed_from_step is None and fresh.resume_note == ""
    assert re.match(r"numpy: 20 steps in \d+\.\ds \(\d+\.\d steps/s\); loss=", fresh.summary())
    assert "resumed" not in fresh.summary()

    more = _run(tmp_path, 30)  # resumes from the checkpoint at 20, trains 10 more
    assert more.resume_note == "resumed at step 20"
    assert re.match(
        r"numpy: 30 steps \(resumed at step 20, 10 this run\) in \d+\.\ds \(\d+\.\d steps/s\); ",
        more.summary(),
    )

    again = _run(tmp_path, 30)  # nothing left: the summary says so instead of a rate
    assert again.steps == again.resumed_from_step == 30
    assert again.resume_note == "resumed at step 30, nothing left to train"
    summary = again.summary()
    assert summary.startswith("numpy: 30 steps (resumed at step 30, nothing left to train); loss=")
    assert "steps/s" not in summary and summary.endswith(again.weights_sha256[:12])
