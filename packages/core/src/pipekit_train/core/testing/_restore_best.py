"""The check every backend's `restore_best` passes: the artifact holds the best checkpoint.

`check_restore_best(make_model, adapter, tmp_path)` trains `regression_task` for
`RESTORE_BEST_STEPS` steps, validating every 2, with a callback that reports a
validation metric it controls (`ScoreReporter`, `val_score`): its best value comes at
step `RESTORE_BEST_STEP`, and the last validation ties it (the earlier step is the
best). The checkpoint keeps the latest step and the best one, and its schedule saves
only the last step, so the best step's checkpoint exists only because the run saves at
every improvement. The artifact must then hold the weights the best checkpoint
resumes with, byte for byte: a run resumed from a copy of that step alone (the
backend's own restore path) and ending there returns them.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pipekit_train.core import Checkpoint, TrainingArtifact, TrainingLoop
from pipekit_train.core.checkpoint import step_dirs

from ._tasks import regression_task

__all__ = [
    "RESTORE_BEST_SCORES",
    "RESTORE_BEST_STEP",
    "RESTORE_BEST_STEPS",
    "ScoreReporter",
    "check_restore_best",
    "checkpoint_weights",
    "restore_best_loop",
]

RESTORE_BEST_STEPS = 10
RESTORE_BEST_STEP = 4
RESTORE_BEST_SCORES: dict[int, float] = {2: 3.0, 4: 1.0, 6: 2.0, 8: 1.5, 10: 1.0}
"""`val_score` at each validation: best at step 4, tied (not beaten) at the end."""


class ScoreReporter:
    """A validation metric the test controls: `val_score = scores[step]`."""

    produces: tuple[str, ...] = ("val_score",)

    def __init__(self, scores: Mapping[int, float] = RESTORE_BEST_SCORES):
        self.scores = dict(scores)

    def validation_metrics(self, state: Any) -> dict[str, float]:
        """`{"score": ...}` of this step (recorded as `val_score`)."""
        return {"score": self.scores[int(state.step)]}


def restore_best_loop(
    make_model: Callable[[], Any], adapter: Any, directory: Path, **overrides: Any
) -> TrainingLoop:
    """The check's run: `val_score` reported every 2 steps, the best kept and restored."""
    train, val = regression_task(n_train=64, n_val=16)
    kwargs: dict[str, Any] = {
        "validation": val,
        "loss": "mse",
        "optimizer_config": {"name": "adam", "lr": 0.05},
        "batch_size": 16,
        "max_steps": RESTORE_BEST_STEPS,
        "validate_every_n_steps": 2,
        "callbacks": [ScoreReporter()],
        "checkpoint": Checkpoint(
            directory,
            every_n_steps=1000,
            max_to_keep=1,
            keep_best=1,
            monitor="val_score",
            async_save=False,
        ),
        "seed": 0,
        "adapter": adapter,
        "progress": False,
        "restore_best": True,
    }
    kwargs.update(overrides)
    return TrainingLoop(make_model(), train, **kwargs)


def checkpoint_weights(
    make_model: Callable[[], Any], adapter: Any, directory: Path, step: int, scratch: Path
) -> bytes:
    """The weights checkpoint `directory/<step>` resumes with: a run resumed from a copy
    of that step alone, ending at it (no training step), returns them."""
    copy = scratch / f"resume-{step}"
    shutil.copytree(directory / str(step), copy / str(step))
    art = TrainingLoop(
        make_model(),
        regression_task(n_train=64, n_val=16)[0],
        loss="mse",
        optimizer_config={"name": "adam", "lr": 0.05},
        batch_size=16,
        max_steps=step,
        checkpoint=Checkpoint(copy, resume="must", async_save=False),
        seed=0,
        adapter=adapter,
        progress=False,
    ).run()
    assert art.resumed_from_step == step and art.steps == step, (art.resumed_from_step, art.steps)
    return bytes(art.model.serialize_weights())


def check_restore_best(
    make_model: Callable[[], Any], adapter: Any, tmp_path: Path
) -> TrainingArtifact:
    """The artifact of a `restore_best=True` run holds the best checkpoint's weights.

    Args:
        make_model: a fresh model operator (4 inputs, 1 output, the same weights each call).
        adapter: the backend's adapter.
        tmp_path: an empty folder.

    Returns:
        The run's artifact (for further backend checks).
    """
    directory = tmp_path / "ck"
    art = restore_best_loop(make_model, adapter, directory).run()
    assert art.steps == RESTORE_BEST_STEPS, art.steps
    assert art.best_step == RESTORE_BEST_STEP and art.best_metric == 1.0, art.best_step
    assert art.weights_step == RESTORE_BEST_STEP, art.weights_step
    # the schedule saves only the last step: the best one was saved when it improved, and
    # kept (the tie at the end ranks after it)
    assert step_dirs(directory) == [RESTORE_BEST_STEP, RESTORE_BEST_STEPS], step_dirs(directory)
    best = checkpoint_weights(make_model, adapter, directory, RESTORE_BEST_STEP, tmp_path)
    assert bytes(art.model.serialize_weights()) == best
    assert art.weights_sha256 == TrainingArtifact.hash_weights(art.model)
    return art
