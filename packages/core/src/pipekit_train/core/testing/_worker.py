"""Subprocess worker of the conformance suite's kill-and-resume test.

`python -m pipekit_train.core.testing._worker spec.json` trains per the spec and kills
itself with SIGKILL at `kill_at` (after at least one checkpoint), like a preempted job.
`directory` may be a URI, with the fsspec `storage_options` to reach it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any


def build_adapter(config: dict[str, Any] | None) -> Any:
    """Rebuild an adapter from `{"type": "module:Class", "kwargs": {...}}` (None → inferred)."""
    if not config:
        return None
    from pipekit_train.core.adapter import import_string

    return import_string(config["type"], field="adapter")(**config.get("kwargs", {}))


def main(path: str) -> None:
    with open(path) as fh:
        spec = json.load(fh)
    for entry in spec.get("sys_path", []):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    from pipekit_train.core import Checkpoint, TrainingLoop
    from pipekit_train.core._operators import model_op_from_config
    from pipekit_train.core.callbacks import LambdaCallback

    from ._tasks import oscillator_task, regression_task

    task = regression_task if spec["task"] == "regression" else oscillator_task
    train, val = task()
    kill_at = int(spec["kill_at"])

    def on_step_end(state: Any) -> None:
        if state.step >= kill_at:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    loop = TrainingLoop(
        model=model_op_from_config(spec["model"]),
        data=train,
        validation=val,
        loss="mse",
        optimizer_config=spec["optimizer_config"],
        batch_size=spec["batch_size"],
        max_steps=spec["max_steps"],
        checkpoint=Checkpoint(
            spec["directory"],
            every_n_steps=spec["every_n_steps"],
            max_to_keep=None,
            storage_options=spec.get("storage_options"),
        ),
        validate_every_n_steps=spec.get("validate_every_n_steps"),
        seed=spec["seed"],
        adapter=build_adapter(spec.get("adapter")),
        callbacks=[LambdaCallback(on_step_end=on_step_end)],
        progress=False,
    )
    loop.run()
    print("worker finished without being killed", flush=True)
    sys.exit(3)


if __name__ == "__main__":
    main(sys.argv[1])
