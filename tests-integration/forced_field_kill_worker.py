"""Subprocess worker of the forced field emulator's kill-and-resume test.

`python forced_field_kill_worker.py <backend> <hdf5_path> <checkpoint_dir> <steps> <kill_at>`
trains the example's description (`forced_field.training_loop`: a small conv net through
a rollout of 4 steps, history 2, the diffusivity static and the source amplitude a
forcing) on windows streamed from the example's The Well-layout HDF5 file, checkpointing
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


def loop(backend: str, path: str, steps: int, **kwargs: Any) -> Any:
    """The run the test kills and resumes (and runs uninterrupted)."""
    import forced_field as ff

    from pipekit_train.core import Rollout

    train = ff.windows(Path(path), k=4, history=2)
    val = train.with_trajectories(train.trajectories.select([0]))  # one trajectory: cheap
    rollout = Rollout(steps=4, residual=True, noise_std=0.02)
    return ff.training_loop(backend, train, val, steps=steps, rollout=rollout, **SMALL, **kwargs)


def main(backend: str, path: str, directory: str, steps: str, kill_at: str) -> None:
    from pipekit_train.core import Checkpoint
    from pipekit_train.core.callbacks import LambdaCallback

    def on_step_end(state: Any) -> None:
        if state.step >= int(kill_at):
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    run = loop(
        backend,
        path,
        int(steps),
        checkpoint=Checkpoint(directory, every_n_steps=4, max_to_keep=None),
        callbacks=[LambdaCallback(on_step_end=on_step_end)],
    )
    run.run()
    print("worker finished without being killed", flush=True)
    sys.exit(3)


if __name__ == "__main__":
    main(*sys.argv[1:6])
