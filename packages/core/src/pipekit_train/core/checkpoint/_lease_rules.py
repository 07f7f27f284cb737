"""Who holds a run lease, and when a holder counts as dead: the rules, in one place.

A holder is dead, and its lease may be taken over:

| the holder's record says | dead when |
|---|---|
| it was released | at once (it ended) |
| any holder | its heartbeat is older than `lease_timeout` (any host, any scheduler) |
| the same host name **and** the same pid space (Linux: boot id + pid namespace) | its process no longer exists, or its pid now belongs to a process started later (reused) |
| the same scheduler job and step, an earlier restart (`SLURM_RESTART_COUNT`, `TORCHELASTIC_RESTART_COUNT`, `PIPEKIT_TRAIN_JOB_RESTART`) | at once (the scheduler restarted the job) |
| an unreadable record (damaged, or half written by an old version) | its file is older than `lease_timeout` |

Anything else is alive: a pid that looks dead in another container that shares the host
name, or another step of the same job (`SLURM_STEP_ID`), waits for the heartbeat. Off
Linux there is no pid space, so only the heartbeat, the restart count and a release count.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "LeaseHolder",
    "pid_space",
    "process_started",
    "scheduler_job",
    "takeover_reason",
]


@functools.cache
def pid_space() -> str | None:
    """This process's pid space: the boot id and pid namespace (Linux), else None.

    Two processes can compare pids only when their pid spaces are equal: a container with
    its own pid namespace, or a reboot, gives another one.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return f"{boot}/{namespace}" if boot else None


def process_started(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, Linux), or None if unknown."""
    stat = _stat(pid)
    if stat is None or len(stat) < 20:
        return None
    try:
        return int(stat[19])
    except ValueError:
        return None


def _stat(pid: int) -> list[str] | None:
    """The fields of `/proc/<pid>/stat` after the command name, or None."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    return data.rsplit(b")", 1)[-1].decode(errors="replace").split()


def _process_gone(pid: int, started: int | None) -> str | None:
    """Why process `pid` (started at `started`) provably no longer runs, or None."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return f"its process {pid} no longer exists on this host"
    except PermissionError:
        pass  # it exists, owned by someone else
    except OSError:
        return None
    stat = _stat(pid)
    if stat is None:
        return None
    if stat and stat[0] == "Z":
        return f"its process {pid} has ended (a zombie)"
    now_started = process_started(pid)
    if started is not None and now_started is not None and now_started != started:
        return f"its process id {pid} now belongs to another process (started later)"
    return None


def scheduler_job() -> tuple[str | None, int | None]:
    """`(job, restart)`: the scheduler job and step this process belongs to, and how many
    times the scheduler restarted it (None when it does not say)."""
    env = os.environ

    def count(name: str) -> int | None:
        value = env.get(name, "")
        return int(value) if value.strip().isdigit() else None

    explicit = env.get("PIPEKIT_TRAIN_JOB_ID")
    if explicit:
        return f"job:{explicit}", count("PIPEKIT_TRAIN_JOB_RESTART")
    slurm = env.get("SLURM_ARRAY_JOB_ID") or env.get("SLURM_JOB_ID")
    if slurm:
        task = env.get("SLURM_ARRAY_TASK_ID")
        step = env.get("SLURM_STEP_ID") or "batch"
        job = f"slurm:{slurm}" + (f"/{task}" if task else "") + f".{step}"
        return job, count("SLURM_RESTART_COUNT") or 0
    elastic = env.get("TORCHELASTIC_RUN_ID")
    if elastic and elastic != "none":
        return f"torchelastic:{elastic}", count("TORCHELASTIC_RESTART_COUNT") or 0
    return None, None


def _clock(seconds: float) -> str:
    return _dt.datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S")


@dataclass(frozen=True)
class LeaseHolder:
    """What a lease record says about the run that holds (or held) the location.

    Attributes:
        host: the holder's host name.
        pid: its process id.
        token: a random id of this holding (a restarted run gets a new one).
        fingerprint: `plan_fingerprint` of the holder's plan.
        started: when it took the lease (seconds since the epoch).
        heartbeat: when it last renewed it (seconds since the epoch).
        job: the scheduler job and step (`scheduler_job()`), or None.
        generation: the lease generation (the fencing token): one more at every taking.
        restart: the scheduler's restart count of the job, or None.
        pid_space: the holder's pid space (`pid_space()`), or None off Linux.
        pid_started: when the holder's process started (Linux clock ticks), or None.
        released: the holder ended and released the location.
        fences: `(generation, step)` pairs (see `_fencing`).
    """

    host: str
    pid: int
    token: str
    fingerprint: str
    started: float
    heartbeat: float
    job: str | None = None
    generation: int = 0
    restart: int | None = None
    pid_space: str | None = None
    pid_started: int | None = None
    released: bool = False
    fences: tuple[tuple[int, int], ...] = field(default=())

    @classmethod
    def here(cls, *, token: str, fingerprint: str, generation: int, **kw: Any) -> LeaseHolder:
        """A record naming this process, heartbeat now."""
        now = time.time()
        job, restart = scheduler_job()
        base: dict[str, Any] = dict(
            host=socket.gethostname(),
            pid=os.getpid(),
            token=token,
            fingerprint=fingerprint,
            started=now,
            heartbeat=now,
            job=job,
            generation=generation,
            restart=restart,
            pid_space=pid_space(),
            pid_started=process_started(os.getpid()),
        )
        base.update(kw)
        return cls(**base)

    def to_bytes(self) -> bytes:
        """The record's content."""
        raw = asdict(self)
        raw["fences"] = [list(f) for f in self.fences]
        return json.dumps(raw, indent=1).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> LeaseHolder | None:
        """The holder a record names (None: unreadable, e.g. damaged or empty)."""
        try:
            raw = json.loads(data.decode())

            def opt_int(key: str) -> int | None:
                return None if raw.get(key) is None else int(raw[key])

            return cls(
                host=str(raw["host"]),
                pid=int(raw["pid"]),
                token=str(raw["token"]),
                fingerprint=str(raw["fingerprint"]),
                started=float(raw["started"]),
                heartbeat=float(raw["heartbeat"]),
                job=None if raw.get("job") is None else str(raw["job"]),
                generation=int(raw.get("generation", 0)),
                restart=opt_int("restart"),
                pid_space=None if raw.get("pid_space") is None else str(raw["pid_space"]),
                pid_started=opt_int("pid_started"),
                released=bool(raw.get("released", False)),
                fences=tuple((int(g), int(s)) for g, s in raw.get("fences", [])),
            )
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, AttributeError):
            return None

    def describe(self, now: float | None = None) -> str:
        """`host n12, pid 4711, started 2026-12-05 12:03:10, last heartbeat 2 s ago, ...`."""
        now = time.time() if now is None else now
        ago = max(0.0, now - self.heartbeat)
        job = f", job {self.job}" if self.job else ""
        restart = f" (restart {self.restart})" if self.job and self.restart else ""
        return (
            f"host {self.host}, pid {self.pid}{job}{restart}, started {_clock(self.started)}, "
            f"last heartbeat {ago:.0f} s ago, plan {self.fingerprint}, generation {self.generation}"
        )

    def same_process_space(self) -> bool:
        """Whether this process can judge the holder's pid (same host and pid space)."""
        space = pid_space()
        return self.host == socket.gethostname() and space is not None and self.pid_space == space


def takeover_reason(
    holder: LeaseHolder, *, timeout: float, now: float | None = None, held: bool = False
) -> str | None:
    """Why `holder` is dead and may be taken over, or None while it may be alive.

    Args:
        holder: the newest lease record.
        timeout: `Checkpoint.lease_timeout`.
        now: the reader's clock (seconds since the epoch).
        held: whether this process holds that very lease (its token) now.
    """
    now = time.time() if now is None else now
    if holder.released:
        return "it was released"
    age = now - holder.heartbeat
    if age > timeout:
        return f"its last heartbeat is {age:.0f} s old (lease_timeout={timeout:g} s)"
    if holder.same_process_space():
        if holder.pid == os.getpid() and holder.pid_started == process_started(os.getpid()):
            return None if held else "it names this process, which no longer holds it"
        gone = _process_gone(holder.pid, holder.pid_started)
        if gone is not None:
            return gone
    job, restart = scheduler_job()
    if (
        job is not None
        and holder.job == job
        and restart is not None
        and holder.restart is not None
        and restart > holder.restart
    ):
        return (
            f"it is an earlier run of this scheduler job ({job}, restart {holder.restart}; "
            f"this is restart {restart})"
        )
    return None
