"""`RayProbe`: the callback of the Ray Train restart tests (every backend's).

Added to a loop that `fit_on_ray` runs, it records what each worker did and, once per
job, kills one worker without warning (SIGKILL of its own process) at a chosen step, like
a lost node: Ray then restarts the group, and the restarted group must resume from
pipekit's latest complete checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from pipekit_train.core.checkpoint import Checkpoint, step_dirs
from pipekit_train.core.checkpoint._digest import FOLDER_DIGEST
from pipekit_train.core.checkpoint._store import MANIFEST, open_store

__all__ = ["RayProbe"]


class RayProbe:
    """Record each Ray Train worker's run; optionally SIGKILL one worker once.

    On every worker it writes `<out>/<tag>-rank<r>.json` at the end of training:
    `{"rank", "steps", "resumed_from_step", "sha" (SHA-256 of the weight bytes), "job"
    (`PIPEKIT_TRAIN_JOB_ID`), "pid"}`, and appends `<pid> <step>` to
    `<out>/<tag>-starts.txt` at each start.

    Args:
        out: a folder every worker reaches.
        tag: the run's name in the file names.
        kill_at: the step after which worker `kill_rank` kills itself (once per `tag`:
            a marker file `<out>/<tag>.killed` keeps the restarted group alive), or None.
        kill_rank: the Ray Train world rank that dies.
        checkpoint: the run's checkpoint location: before the kill, wait (up to 60 s)
            until the last step due by `kill_at` is complete (its commit marker written),
            so the resume point is the one the test names rather than a race with a
            background write.
        every_n_steps: the run's checkpoint cadence (with `checkpoint`).
    """

    def __init__(
        self,
        out: str | os.PathLike[str],
        tag: str,
        *,
        kill_at: int | None = None,
        kill_rank: int = 1,
        checkpoint: str | Checkpoint | None = None,
        every_n_steps: int | None = None,
    ):
        self.out, self.tag = Path(out), tag
        self.kill_at, self.kill_rank = kill_at, kill_rank
        self.checkpoint, self.every_n_steps = checkpoint, every_n_steps

    @staticmethod
    def _rank() -> int:
        import ray.train

        return int(ray.train.get_context().get_world_rank())

    def on_train_start(self, state: Any) -> None:
        """Append this worker's pid and start step."""
        with open(self.out / f"{self.tag}-starts.txt", "a") as fh:
            fh.write(f"{os.getpid()} {state.step}\n")

    def on_step_end(self, state: Any) -> None:
        """At `kill_at`, on `kill_rank`, the first time: SIGKILL this process."""
        if self.kill_at is None or state.step != self.kill_at or self._rank() != self.kill_rank:
            return
        try:
            fd = os.open(self.out / f"{self.tag}.killed", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return  # the restarted group: train on
        os.close(fd)
        if self.checkpoint is not None and self.every_n_steps:
            due = self.kill_at // self.every_n_steps * self.every_n_steps
            deadline = time.monotonic() + 60
            while due and not self._committed(due) and time.monotonic() < deadline:
                time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)

    def _committed(self, step: int) -> bool:
        """Whether step `step` is complete: its commit marker (written last) is there.

        A step folder appears before its marker (an engine's folder is renamed into place,
        then sealed; on another rank the write may still be running): killing a worker
        then can tear the step, and the group would resume from the one before.
        """
        assert self.checkpoint is not None
        policy = (
            self.checkpoint
            if isinstance(self.checkpoint, Checkpoint)
            else Checkpoint(self.checkpoint)
        )
        if step not in step_dirs(policy):
            return False
        store = open_store(policy)
        for marker in (MANIFEST, FOLDER_DIGEST):
            try:
                store.read(step, marker)
            except OSError:
                continue
            return True
        return False

    def on_train_end(self, state: Any, artifact: Any) -> None:
        """Write this worker's record."""
        record = {
            "rank": self._rank(),
            "steps": artifact.steps,
            "resumed_from_step": artifact.resumed_from_step,
            "sha": hashlib.sha256(artifact.model.serialize_weights()).hexdigest(),
            "job": os.environ.get("PIPEKIT_TRAIN_JOB_ID"),
            "pid": os.getpid(),
        }
        path = self.out / f"{self.tag}-rank{record['rank']}.json"
        path.write_text(json.dumps(record))
