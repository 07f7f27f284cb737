"""Lease test helpers: plant a holder's record, and stop the lease's work at a named point.

- `plant_lease(directory, pid)` writes the record of the next generation at a local
  checkpoint location, naming a holder (this host and pid space by default).
- `lease_failpoint(name, action)` makes the run lease (or its exclusive create) call
  `action()` at a named point of its work, in this process. The points:
  `"acquire:create"` (a new generation's record is about to be created),
  `"heartbeat:read"` (a heartbeat found the lease its own and is about to rewrite the
  record), `"create:link"` (an exclusive create has written and flushed the record and
  is about to make it visible), `"save:checked"` (a run checked its lease before a save
  and is about to write the step).
- `stop_self(marker)`: an action that writes `marker` and stops this process with
  `SIGSTOP`, as a stall does: the test resumes it with `SIGCONT`.
- `stall_and_take_over(...)`: the whole fencing trial on one backend (stall a run at a
  save, take its location over, wake it, let it write, resume) — see its docstring.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipekit_train.core import _atomic
from pipekit_train.core.checkpoint import _lease
from pipekit_train.core.checkpoint._lease_records import LEASE_DIR, lease_records
from pipekit_train.core.checkpoint._lease_rules import LeaseHolder, pid_space, process_started
from pipekit_train.core.checkpoint._policy import Checkpoint

__all__ = [
    "StallTrial",
    "lease_failpoint",
    "plant_lease",
    "stall_and_take_over",
    "stop_self",
]


def plant_lease(
    directory: str | Path,
    pid: int,
    *,
    host: str | None = None,
    record: bytes | None = None,
    **fields: Any,
) -> LeaseHolder:
    """Write the next generation's lease record at `directory` naming process `pid` on
    `host` (this host, and this pid space, by default), heartbeat now; return the holder.

    A live `pid` makes the location held. `record` writes those bytes instead (a damaged
    record); `fields` override the holder's other fields.
    """
    now = time.time()
    records = lease_records(Checkpoint(Path(directory), lease_timeout=None))
    generations = records.generations()
    generation = int(fields.pop("generation", (generations[-1] if generations else 0) + 1))
    here = host is None or host == socket.gethostname()
    base: dict[str, Any] = dict(
        host=socket.gethostname() if host is None else host,
        pid=int(pid),
        token=uuid.uuid4().hex,
        fingerprint="0" * 12,
        started=now - 30,
        heartbeat=now,
        generation=generation,
        pid_space=pid_space() if here else None,
        pid_started=process_started(int(pid)) if here else None,
    )
    base.update(fields)
    holder = LeaseHolder(**base)
    folder = Path(directory) / LEASE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / Path(records.path(generation)).name).write_bytes(
        holder.to_bytes() if record is None else record
    )
    return holder


def lease_failpoint(name: str, action: Callable[[], None] | None) -> None:
    """Call `action()` at the lease's point `name` in this process (None: remove it)."""
    table = _atomic._HOOKS if name == "create:link" else _lease._FAILPOINTS
    if action is None:
        table.pop(name, None)
    else:
        table[name] = action


def stop_self(marker: str | os.PathLike[str], *, on_call: int = 1) -> Callable[[], None]:
    """An action that, on its `on_call`-th call, writes `marker` (this process's pid) and
    stops this process (`SIGSTOP`), as a stall does. The calling thread goes on only once
    the process was continued (`SIGCONT`), wherever the kernel delivered the stop.

    Call it from the main thread (it installs a `SIGCONT` handler).
    """
    calls = [0]
    continued = threading.Event()
    signal.signal(signal.SIGCONT, lambda signum, frame: continued.set())

    def action() -> None:
        calls[0] += 1
        if calls[0] != on_call:
            return
        continued.clear()
        Path(marker).write_text(f"{os.getpid()}\n")
        os.kill(os.getpid(), signal.SIGSTOP)
        while not continued.wait(0.05):
            pass

    return action


@dataclass(frozen=True)
class StallTrial:
    """What `stall_and_take_over` saw.

    Attributes:
        stalled_at: the step the stalled holder was about to save when it stopped.
        resumed_from: the step the new holder resumed from.
        holder_steps: the new holder's last step (it trained to it and saved it).
        final_resumed_from: the step the run after everything resumed from.
        late_steps: steps the stalled holder wrote after it woke (void: never resumed).
        final_sha256: the weights of the run that resumed after everything.
        holder_sha256: the new holder's final weights.
        reference_sha256: an uninterrupted run of `holder_steps` steps from scratch
            (None with `reference=False`).
        stalled_exit: the stalled holder's exit status (`_worker.LEASE_LOST_EXIT`: it
            found it had lost the location).
        stalled_stderr: its standard error.
    """

    stalled_at: int
    resumed_from: int
    holder_steps: int
    final_resumed_from: int
    late_steps: tuple[int, ...]
    final_sha256: str
    holder_sha256: str
    reference_sha256: str | None
    stalled_exit: int
    stalled_stderr: str


def stall_and_take_over(
    *,
    loop: Callable[..., Any],
    spawn: Callable[[Path], Any],
    spec: dict[str, Any],
    workdir: Path,
    directory: str,
    storage_options: dict[str, Any] | None,
    stall_save: int,
    holder_steps: int,
    every: int = 2,
    timeout: float = 1.0,
    reference: bool = True,
) -> StallTrial:
    """Stall a run at a save, take its location over, wake it, let it write; resume.

    1. A worker (`spawn(spec_path)`, `pipekit_train.core.testing._worker` in
       `mode="stall"`) trains with `Checkpoint(directory, every_n_steps=every,
       lease_timeout=timeout)` and stops itself (`SIGSTOP`) at its `stall_save`-th save,
       after its lease check, before the write: a stall in the window fencing exists for.
    2. Once its heartbeat is older than `timeout`, a new holder (`loop(...)`, in this
       process) takes the location over, resumes, trains to `holder_steps` and ends.
    3. The stalled run is woken (`SIGCONT`): it writes the step it was saving (unless
       the new holder wrote that step: then it refuses) and stops at its next save.
    4. A third run resumes the location; its weights, the new holder's and an
       uninterrupted run's are returned (SHA-256), with what each saw.

    Args:
        loop: `**overrides -> TrainingLoop` of the backend (a conformance suite's `loop`).
        spawn: `spec_path -> process` (`pid`, `wait`, `communicate`).
        spec: the worker spec's backend fields (`model`, `adapter`, `task`,
            `optimizer_config`, `batch_size`, `seed`, `sys_path`).
        reference: also train an uninterrupted run from scratch to compare with.
    """
    import hashlib
    import json
    import subprocess

    from pipekit_train.core.checkpoint._engine import step_dirs

    marker = workdir / "stalled"
    full = {
        **spec,
        "mode": "stall",
        "stall_save": int(stall_save),
        "marker": str(marker),
        "directory": directory,
        "storage_options": storage_options,
        "every_n_steps": int(every),
        "max_steps": int(stall_save * every + 4 * every),
        "validate_every_n_steps": None,
        "lease_timeout": float(timeout),
        "kill_at": 0,
        "async_save": False,  # the saves before the stall are complete: it writes on waking
    }
    spec_path = workdir / "stall-spec.json"
    spec_path.write_text(json.dumps(full))
    proc = spawn(spec_path)
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            if proc.poll() is not None:
                out, err = proc.communicate()
                raise AssertionError(f"the worker ended before it stalled: {err[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError("the worker did not reach its stall within 300 s")
            time.sleep(0.02)
        policy = Checkpoint(
            directory,
            every_n_steps=every,
            max_to_keep=None,
            lease_timeout=timeout,
            storage_options=storage_options,
        )
        deadline = time.monotonic() + 120
        records = lease_records(policy)
        while not _lease.inspect_lease(records, timeout=timeout).may_take:
            assert time.monotonic() < deadline, "the stalled run's lease never went stale"
            time.sleep(0.05)  # its heartbeat stopped with it: stale after `timeout`
        while True:  # a refusal here would be a heartbeat the stall did not stop
            try:
                holder = loop(max_steps=holder_steps, checkpoint=policy).run()
                break
            except _lease.LeaseError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        written = set(step_dirs(policy))
        os.kill(proc.pid, signal.SIGCONT)
        try:
            status = proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        _, err = proc.communicate()
        late = tuple(sorted(set(step_dirs(policy)) - written))
        final = loop(max_steps=holder_steps, checkpoint=policy).run()
        uninterrupted = loop(max_steps=holder_steps).run() if reference else None
    finally:
        with contextlib.suppress(Exception):
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()

    def sha(artifact: Any) -> str:
        return hashlib.sha256(artifact.model.serialize_weights()).hexdigest()

    return StallTrial(
        stalled_at=int(stall_save * every),
        resumed_from=int(holder.resumed_from_step or 0),
        holder_steps=int(holder_steps),
        final_resumed_from=int(final.resumed_from_step or -1),
        late_steps=late,
        final_sha256=sha(final),
        holder_sha256=sha(holder),
        reference_sha256=None if uninterrupted is None else sha(uninterrupted),
        stalled_exit=int(status),
        stalled_stderr=err,
    )
