"""Subprocess worker of the field emulator's kill-and-resume test.

`python field_kill_worker.py <backend> <cache_uri> <checkpoint_dir> <steps> <kill_at>`
trains the example's description (`field_emulator.training_loop`, a small conv net, the
example's default rollout training) on windows of the cached trajectories, checkpointing
every 4 steps, and kills itself with SIGKILL after step `kill_at`, like a preempted job.
Keras's backend comes from `KERAS_BACKEND`.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

SMALL = {"batch_size": 8, "width": 4, "depth": 1}
"""The conv net and batch of the kill-and-resume test (the test resumes with the same)."""


def main(backend: str, cache_uri: str, directory: str, steps: str, kill_at: str) -> None:
    import field_emulator as fe

    from pipekit_train.core import Checkpoint
    from pipekit_train.core.callbacks import LambdaCallback
    from pipekit_train.core.data import CachedDataset

    rollout = fe.rollout_setting(fe.TRAINING, steps)
    train, val, norm = fe.training_data(CachedDataset(cache_uri), rollout)

    def on_step_end(state: Any) -> None:
        if state.step >= int(kill_at):
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    loop = fe.training_loop(
        backend,
        train,
        val,
        norm,
        steps=int(steps),
        rollout=rollout,
        checkpoint=Checkpoint(directory, every_n_steps=4, max_to_keep=None),
        callbacks=[LambdaCallback(on_step_end=on_step_end)],
        **SMALL,
    )
    loop.run()
    print("worker finished without being killed", flush=True)
    sys.exit(3)


if __name__ == "__main__":
    main(*sys.argv[1:6])
