"""Subprocess worker of the conformance suite's kill-and-resume and preemption tests.

`python -m pipekit_train.core.testing._worker spec.json` trains per the spec. With
`mode="kill"` (the default) it kills itself with SIGKILL at `kill_at` (after at least one
checkpoint), like a job killed without warning. With `mode="preempt"` it trains slowly
(`step_sleep` seconds per step), writes its progress to `progress` (the step, and one
`checkpoint <step>` line per checkpoint) and waits for the test to send it a preemption
signal: on `Preempted` it writes `{"step", "checkpoint", "signal"}` to `result` and exits
with `PREEMPTED_EXIT_STATUS`, as the CLI does. `directory` may be a URI, with the fsspec
`storage_options` to reach it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
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
    from pipekit_train.core import PREEMPTED_EXIT_STATUS, Checkpoint, Preempted, TrainingLoop
    from pipekit_train.core._operators import model_op_from_config
    from pipekit_train.core.callbacks import LambdaCallback

    from ._tasks import oscillator_task, regression_task

    task = regression_task if spec["task"] == "regression" else oscillator_task
    train, val = task()
    kill_at = int(spec.get("kill_at") or 0)
    preempt = spec.get("mode") == "preempt"
    progress = open(spec["progress"], "a", buffering=1) if preempt else None  # noqa: SIM115
    sleep = float(spec.get("step_sleep", 0.0))

    def on_step_end(state: Any) -> None:
        if progress is not None:
            progress.write(f"step {state.step}\n")
            time.sleep(sleep)
        elif state.step >= kill_at:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    def on_checkpoint(state: Any, path: str) -> None:
        if progress is not None:
            progress.write(f"checkpoint {state.step}\n")

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
            every_n_minutes=spec.get("every_n_minutes"),
        ),
        validate_every_n_steps=spec.get("validate_every_n_steps"),
        seed=spec["seed"],
        adapter=build_adapter(spec.get("adapter")),
        callbacks=[LambdaCallback(on_step_end=on_step_end, on_checkpoint=on_checkpoint)],
        progress=False,
        **({"max_time": spec["max_time"]} if spec.get("max_time") else {}),
    )
    try:
        artifact = loop.run()
    except Preempted as exc:
        with open(spec["result"], "w") as fh:
            json.dump({"step": exc.step, "checkpoint": exc.checkpoint, "signal": exc.signal}, fh)
        sys.exit(PREEMPTED_EXIT_STATUS)
    if preempt:
        with open(spec["result"], "w") as fh:
            json.dump({"steps": artifact.steps, "stop_reason": artifact.stop_reason}, fh)
        print("worker finished without being preempted", flush=True)
        sys.exit(4)
    print("worker finished without being killed", flush=True)
    sys.exit(3)


if __name__ == "__main__":
    main(sys.argv[1])
