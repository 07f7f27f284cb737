"""Subprocess worker of the conformance suite's kill-and-resume and preemption tests.

`python -m pipekit_train.core.testing._worker spec.json` trains per the spec. With
`mode="kill"` (the default) it kills itself with SIGKILL at `kill_at` (after at least one
checkpoint), like a job killed without warning. With `mode="preempt"` it trains slowly
(`step_sleep` seconds per step), writes its progress to `progress` (the step, and one
`checkpoint <step>` line per checkpoint) and waits for the test to send it a preemption
signal: on `Preempted` it writes `{"step", "checkpoint", "signal"}` to `result` and exits
with `PREEMPTED_EXIT_STATUS`, as the CLI does. `directory` may be a URI, with the fsspec
`storage_options` to reach it.

With `hold_first_write` the first checkpoint's commit (the store call that makes a step
complete, on the engine's writer thread when the save is async) writes `writing <step>`
to `progress`, then waits until the run's preemption handler has recorded a signal, and
only then commits (`committed <step>` once the step is complete): the signal provably
arrives while that write is in flight. `preempted` is the last line once `Preempted` is
caught, so its order against `committed <step>` shows the run waited for the write.

With `mode="stall"` it stalls (stops itself with `SIGSTOP`, writing `marker` first) at
its `stall_save`-th save, after the lease check and before the write, with
`lease_timeout` on its `Checkpoint`: the test takes the location over and resumes it with
`SIGCONT`. A run that then finds it lost the location exits with `LEASE_LOST_EXIT`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

HOLD_TIMEOUT_S = 120.0  # a held write that never sees a signal fails (no silent pass)
LEASE_LOST_EXIT = 5  # `mode="stall"`: the run stopped with `LeaseError` (it lost the location)


def build_adapter(config: dict[str, Any] | None) -> Any:
    """Rebuild an adapter from `{"type": "module:Class", "kwargs": {...}}` (None → inferred)."""
    if not config:
        return None
    from pipekit_train.core.utils import import_string

    return import_string(config["type"], field="adapter")(**config.get("kwargs", {}))


def _signal_recorded(names: list[str]) -> bool:
    """Whether the run's `SignalFlag` (installed for `names`) has recorded a signal."""
    from pipekit_train.core.run._preemption import SignalFlag

    for name in names:
        owner = getattr(signal.getsignal(signal.Signals[name]), "__self__", None)
        if isinstance(owner, SignalFlag) and owner.received is not None:
            return True
    return False


def hold_first_write(progress: Any, names: list[str]) -> None:
    """Make the first checkpoint commit wait, in flight, until a preemption signal arrived.

    Wraps `CheckpointStore.commit_blobs` / `commit_folder`, the calls every engine makes
    to complete a step, so it holds for both the directory and the Orbax engine.
    """
    from pipekit_train.core.checkpoint._store import CheckpointStore

    first = threading.Lock()

    def wrap(original: Any) -> Any:
        def commit(self: Any, step: int, *args: Any, **kwargs: Any) -> str:
            if first.acquire(blocking=False):  # the first commit of the run only
                progress.write(f"writing {step}\n")
                deadline = time.monotonic() + HOLD_TIMEOUT_S
                while not _signal_recorded(names):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"no preemption signal within {HOLD_TIMEOUT_S}s")
                    time.sleep(0.005)
                progress.write(f"signalled during write {step}\n")
            location = original(self, step, *args, **kwargs)
            progress.write(f"committed {step}\n")
            return str(location)

        return commit

    for name in ("commit_blobs", "commit_folder"):
        setattr(CheckpointStore, name, wrap(getattr(CheckpointStore, name)))


def main(path: str) -> None:
    with open(path) as fh:
        spec = json.load(fh)
    for entry in spec.get("sys_path", []):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    from pipekit_train.core import (
        PREEMPTED_EXIT_STATUS,
        Checkpoint,
        LeaseError,
        Preempted,
        TrainingLoop,
    )
    from pipekit_train.core.callbacks import LambdaCallback
    from pipekit_train.core.losses import from_description
    from pipekit_train.core.model._operators import model_op_from_config

    from ._tasks import TASKS, task_loss

    extra: dict[str, Any] = {}
    if spec["task"] == "rollout":  # training through the rollout (`check_rollout_kill_resume`)
        from pipekit_train.core import Rollout

        from ._golden_rollout import golden_rollout_task

        train, val = golden_rollout_task()
        extra = {"rollout": Rollout.from_json(spec["rollout"]), "normalizer": train.normalizer()}
    else:
        train, val = TASKS[spec["task"]]()
    kill_at = int(spec.get("kill_at") or 0)
    preempt = spec.get("mode") == "preempt"
    progress = open(spec["progress"], "a", buffering=1) if preempt else None  # noqa: SIM115
    sleep = float(spec.get("step_sleep", 0.0))
    if spec.get("hold_first_write"):
        from pipekit_train.core.spec._signals import DEFAULT_PREEMPTION_SIGNALS

        hold_first_write(progress, list(DEFAULT_PREEMPTION_SIGNALS))

    stall = spec.get("mode") == "stall"
    if stall:
        from ._lease import lease_failpoint, stop_self

        lease_failpoint("save:checked", stop_self(spec["marker"], on_call=int(spec["stall_save"])))

    def on_step_end(state: Any) -> None:
        if stall:
            time.sleep(sleep)
        elif progress is not None:
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
        loss=(
            task_loss(spec["task"]) if spec.get("loss") is None else from_description(spec["loss"])
        ),
        optimizer_config=spec["optimizer_config"],
        batch_size=spec["batch_size"],
        max_steps=spec["max_steps"],
        checkpoint=Checkpoint(
            spec["directory"],
            every_n_steps=spec["every_n_steps"],
            max_to_keep=None,
            storage_options=spec.get("storage_options"),
            every_n_minutes=spec.get("every_n_minutes"),
            lease_timeout=spec.get("lease_timeout", 120.0),
            async_save=spec.get("async_save", True),
        ),
        validate_every_n_steps=spec.get("validate_every_n_steps"),
        seed=spec["seed"],
        adapter=build_adapter(spec.get("adapter")),
        callbacks=[LambdaCallback(on_step_end=on_step_end, on_checkpoint=on_checkpoint)],
        progress=False,
        **({"max_time": spec["max_time"]} if spec.get("max_time") else {}),
        **extra,
    )
    try:
        artifact = loop.run()
    except LeaseError as exc:
        if not stall:
            raise
        print(f"LeaseError: {exc}", file=sys.stderr, flush=True)
        sys.exit(LEASE_LOST_EXIT)
    except Preempted as exc:
        if progress is not None:
            progress.write("preempted\n")
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
