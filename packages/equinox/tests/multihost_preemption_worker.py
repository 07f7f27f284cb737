"""One process of the two-process `jax.distributed` preemption test (not collected by pytest).

`python multihost_preemption_worker.py ID PORT DIR MODE MAX_STEPS EVERY` joins a 2-process
`jax.distributed` run on loopback (one CPU device per process, gloo collectives) and
trains the Equinox adapter data-parallel over both processes. With `PORT` 0 it calls
`jax.distributed.initialize()` without arguments: the test set SLURM's variables, and
jax's SLURM detection reads the coordinator, process count and id from them.

- `preempt`: slowly (`SLEEP` s per step), with periodic checkpoints far apart, writing
  `step <n>` lines to `DIR/progress-<id>.txt`, until the test sends a preemption signal
  to one of the processes. On `Preempted` it writes `{"step", "checkpoint", "signal"}`
  to `DIR/result-<id>.json` and exits with `PREEMPTED_EXIT_STATUS`; a run that ends
  unpreempted exits 4.
- `resume`: first tries a run on `DIR/held/ckpt`, whose lease the test holds (refused on
  both processes), then resumes from that checkpoint to `MAX_STEPS`, then trains an uninterrupted
  run of the same length, and writes both runs' steps, resume step, weight digests and
  losses to `DIR/resumed-<id>.json`.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

SLEEP = 0.2  # seconds per step of the preempted run


def _loop(
    directory: Path,
    max_steps: int,
    every: int,
    *,
    checkpoint: bool,
    callbacks: list[Any] | None = None,
) -> Any:
    import jax

    from pipekit_train.core import Checkpoint, TrainingLoop
    from pipekit_train.core.testing import regression_task
    from pipekit_train.equinox import EquinoxModelOp, ShardingSpec

    train, val = regression_task()
    return TrainingLoop(
        model=EquinoxModelOp(
            "pipekit_train.equinox.testing:mlp", in_size=4, out_size=1, width=8, seed=0
        ),
        data=train,
        validation=val,
        loss="mse",
        optimizer_config={"name": "adam", "lr": 0.01},
        batch_size=16,
        max_steps=max_steps,
        seed=0,
        validate_every_n_steps=8,
        checkpoint=Checkpoint(directory / "ckpt", every_n_steps=every, max_to_keep=None)
        if checkpoint
        else None,
        sharding=ShardingSpec(jax.make_mesh((2,), ("data",))),
        callbacks=callbacks or [],
        progress=False,
    )


def _digest(artifact: Any) -> str:
    return hashlib.sha256(artifact.model.serialize_weights()).hexdigest()


def main(
    process_id: int, port: int, directory: Path, mode: str, max_steps: int, every: int
) -> None:
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.pop("XLA_FLAGS", None)
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if port == 0:  # a simulated SLURM job step: jax reads SLURM's variables itself
        jax.distributed.initialize(initialization_timeout=60)
        assert jax.process_index() == process_id, (jax.process_index(), process_id)
    else:
        jax.distributed.initialize(
            coordinator_address=f"127.0.0.1:{port}",
            num_processes=2,
            process_id=process_id,
            initialization_timeout=60,
        )
    from pipekit_train.core import PREEMPTED_EXIT_STATUS, Preempted
    from pipekit_train.core.callbacks import LambdaCallback

    assert jax.process_count() == 2 and jax.device_count() == 2, jax.devices()
    status = 0
    if mode == "preempt":
        progress = open(directory / f"progress-{process_id}.txt", "a", buffering=1)  # noqa: SIM115

        def on_step_end(state: Any) -> None:
            progress.write(f"step {state.step}\n")
            time.sleep(SLEEP)

        try:
            artifact = _loop(
                directory,
                max_steps,
                every,
                checkpoint=True,
                callbacks=[LambdaCallback(on_step_end=on_step_end)],
            ).run()
            outcome: dict[str, Any] = {"steps": artifact.steps, "stop_reason": artifact.stop_reason}
            status = 4
        except Preempted as exc:
            outcome = {"step": exc.step, "checkpoint": exc.checkpoint, "signal": exc.signal}
            status = PREEMPTED_EXIT_STATUS
        (directory / f"result-{process_id}.json").write_text(json.dumps(outcome))
    else:
        from pipekit_train.core.checkpoint._lease import LeaseError

        refused = None
        try:  # the test holds the lease of `held/ckpt`: the job is refused on every process
            _loop(directory / "held", max_steps, every, checkpoint=True).run()
        except LeaseError as err:
            refused = str(err)
        resumed = _loop(directory, max_steps, every, checkpoint=True).run()
        reference = _loop(directory, max_steps, every, checkpoint=False).run()
        out = {
            name: {
                "steps": art.steps,
                "resumed_from_step": art.resumed_from_step,
                "weights": _digest(art),
                "loss_steps": art.history.series("loss")[0],
                "losses": art.history.series("loss")[1],
            }
            for name, art in (("resumed", resumed), ("reference", reference))
        }
        out["refused"] = refused
        (directory / f"resumed-{process_id}.json").write_text(json.dumps(out))
    jax.distributed.shutdown()
    sys.exit(status)


if __name__ == "__main__":
    pid, port, directory, mode, max_steps, every = sys.argv[1:7]
    main(int(pid), int(port), Path(directory), mode, int(max_steps), int(every))
