"""Callbacks for tests-integration/test_cli.py: SIGKILL or SIGTERM the training process at a step.

It kills only once: it leaves a marker file first, so rerunning the very same command
(what a batch scheduler does after a preemption) trains on past that step.
"""

from __future__ import annotations

import os
import signal
from typing import Any


class KillAt:
    """`os.kill(os.getpid(), SIGKILL)` after step `step`, unless `marker` exists."""

    def __init__(self, step: int, marker: str) -> None:
        self.step = int(step)
        self.marker = marker

    def on_step_end(self, state: Any) -> None:
        if state.step == self.step and not os.path.exists(self.marker):
            with open(self.marker, "w") as fh:
                fh.write(str(state.step))
            os.kill(os.getpid(), signal.SIGKILL)


class PreemptAt:
    """`os.kill(os.getpid(), SIGTERM)` after step `step`, unless `marker` exists.

    A real preemption signal: the run's handler turns it into `Preempted` at the step
    boundary (the CLI then exits with status 75), so a rerun resumes.
    """

    def __init__(self, step: int, marker: str) -> None:
        self.step = int(step)
        self.marker = marker

    def on_step_end(self, state: Any) -> None:
        if state.step == self.step and not os.path.exists(self.marker):
            with open(self.marker, "w") as fh:
                fh.write(str(state.step))
            os.kill(os.getpid(), signal.SIGTERM)
