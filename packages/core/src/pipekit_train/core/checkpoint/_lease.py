"""The run lease: one run per checkpoint location.

A run holds a lease on its checkpoint location from before its first piece of work until
it ends (finish, abort, preemption), so that two runs never write into one location. The
lease is one small JSON file at the location's root, `.pipekit-lease.json`, that names its
holder: host, process id, a random token, the plan's fingerprint, the start time, the last
heartbeat and the scheduler's job (SLURM job / array task, torchelastic run, or
`PIPEKIT_TRAIN_JOB_ID`).

- **Taking it** is an atomic create: `O_CREAT | O_EXCL` on a local or shared file system;
  on an fsspec store `pipe_file(mode="create")`, which S3 sends as a conditional write
  (`If-None-Match: *`) and GCS as a generation precondition. A store that cannot create
  conditionally falls back to write-then-read-back (a narrow race: see the checkpoints
  guide).
- **A live holder** refuses the run at once (`LeaseError`, naming the holder).
- **A dead holder is taken over** without waiting: on the same host when its process no
  longer exists; from anywhere when it is the same scheduler job (a requeued SLURM job, a
  restarted elastic group; on the holder's own host once its process has ended, waiting
  up to 30 s), or when its heartbeat is older than `Checkpoint.lease_timeout`.
- **The heartbeat** is renewed by a daemon thread every `lease_timeout / 8` seconds (at
  most 15 s); the thread also notices a lease taken over by another run, and the holder's
  next save then fails with `LeaseError` instead of writing into the new holder's steps.

Clocks: a heartbeat is compared with the reader's wall clock, so hosts that share a
location should keep their clocks in sync (NTP); the default lease time (120 s) leaves
room for the usual skew.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipekit_train.core._errors import CheckpointError

from ._policy import Checkpoint

__all__ = [
    "LEASE_FILE",
    "LeaseError",
    "LeaseHolder",
    "RunLease",
    "may_clean",
    "plan_fingerprint",
    "read_lease",
]

LEASE_FILE = ".pipekit-lease.json"
"""The lease's file name at the root of a checkpoint location."""

_log = logging.getLogger("pipekit_train.lease")

# the leases this process holds now (token → location): a holder record naming this
# process is alive only if its token is here (a restarted container may reuse the pid)
_HELD: dict[str, str] = {}
_HELD_LOCK = threading.Lock()


class LeaseError(CheckpointError):
    """Another run holds the checkpoint location, or this run lost its lease to another."""


def plan_fingerprint(resume_key: Mapping[str, Any]) -> str:
    """A short digest of a plan's resume key: equal for runs that may share checkpoints."""
    text = json.dumps(resume_key, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def scheduler_job() -> str | None:
    """The scheduler job this process belongs to, if any (same job → may take over)."""
    env = os.environ
    explicit = env.get("PIPEKIT_TRAIN_JOB_ID")
    if explicit:
        return f"job:{explicit}"
    slurm = env.get("SLURM_ARRAY_JOB_ID") or env.get("SLURM_JOB_ID")
    if slurm:
        task = env.get("SLURM_ARRAY_TASK_ID")
        return f"slurm:{slurm}" + (f"/{task}" if task else "")
    elastic = env.get("TORCHELASTIC_RUN_ID")
    if elastic and elastic != "none":
        return f"torchelastic:{elastic}"
    return None


def _clock(seconds: float) -> str:
    return _dt.datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S")


@dataclass(frozen=True)
class LeaseHolder:
    """What a lease file says about the run that holds the location.

    Attributes:
        host: the holder's host name.
        pid: its process id.
        token: a random id of this holding (a restarted run gets a new one).
        fingerprint: `plan_fingerprint` of the holder's plan.
        started: when it took the lease (seconds since the epoch).
        heartbeat: when it last renewed it (seconds since the epoch).
        job: the scheduler job (`scheduler_job()`), or None.
    """

    host: str
    pid: int
    token: str
    fingerprint: str
    started: float
    heartbeat: float
    job: str | None = None

    def to_bytes(self) -> bytes:
        """The lease file's content."""
        return json.dumps(asdict(self), indent=1).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> LeaseHolder | None:
        """The holder a lease file names (None: unreadable, e.g. half written)."""
        try:
            raw = json.loads(data.decode())
            return cls(
                host=str(raw["host"]),
                pid=int(raw["pid"]),
                token=str(raw["token"]),
                fingerprint=str(raw["fingerprint"]),
                started=float(raw["started"]),
                heartbeat=float(raw["heartbeat"]),
                job=None if raw.get("job") is None else str(raw["job"]),
            )
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return None

    def describe(self, now: float | None = None) -> str:
        """`host n12, pid 4711, started 2026-12-05 12:03:10, last heartbeat 2 s ago`."""
        now = time.time() if now is None else now
        ago = max(0.0, now - self.heartbeat)
        job = f", job {self.job}" if self.job else ""
        return (
            f"host {self.host}, pid {self.pid}{job}, started {_clock(self.started)}, "
            f"last heartbeat {ago:.0f} s ago, plan {self.fingerprint}"
        )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    except OSError:
        return False
    try:  # Linux: a zombie (ended, not yet reaped by its parent) is not alive
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def takeover_reason(holder: LeaseHolder, *, timeout: float, now: float | None = None) -> str | None:
    """Why `holder` is dead and may be taken over, or None while it may still be alive."""
    now = time.time() if now is None else now
    host = socket.gethostname()
    if holder.host == host:
        if holder.pid == os.getpid():
            with _HELD_LOCK:
                ours = holder.token in _HELD
            return None if ours else "its process id is this process's (a restart reused it)"
        if not _pid_alive(holder.pid):
            return f"its process {holder.pid} no longer exists on this host"
        return None
    job = scheduler_job()
    if job is not None and holder.job == job:
        return f"it is the same scheduler job ({job}), restarted"
    if now - holder.heartbeat > timeout:
        return f"its last heartbeat is {now - holder.heartbeat:.0f} s old (lease_timeout={timeout:g} s)"
    return None


class _LeaseFile:
    """The lease file on a local path or an fsspec filesystem."""

    def __init__(self, policy: Checkpoint):
        self.location = policy.location
        if policy.is_remote:
            self.fs, root = policy.filesystem()
            self.path = f"{root.rstrip('/')}/{LEASE_FILE}"
            self.local: Path | None = None
        else:
            self.fs, self.local = None, policy.path / LEASE_FILE
            self.path = str(self.local)

    def read(self) -> bytes | None:
        if self.local is not None:
            try:
                return self.local.read_bytes()
            except FileNotFoundError:
                return None
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(self.path)
        try:
            return bytes(self.fs.cat_file(self.path))
        except FileNotFoundError:
            return None

    def create(self, data: bytes) -> bool:
        """Create the file if it does not exist; whether this call created it."""
        if self.local is not None:
            self.local.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(self.local, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            return True
        try:
            self.fs.pipe_file(self.path, data, mode="create")
        except FileExistsError:
            return False
        except (NotImplementedError, ValueError, TypeError):
            # no conditional create: write, then read back (the last writer wins)
            if self.read() is not None:
                return False
            self.fs.pipe_file(self.path, data)
            return self.read() == data
        except Exception as err:  # a precondition failure surfaced as the store's own error
            if "PreconditionFailed" in repr(err) or "412" in str(err):
                return False
            raise
        return True

    def replace(self, data: bytes) -> None:
        if self.local is not None:
            tmp = self.local.with_name(f"{LEASE_FILE}.{uuid.uuid4().hex[:8]}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, self.local)
            return
        self.fs.pipe_file(self.path, data)

    def remove(self) -> None:
        if self.local is not None:
            with contextlib.suppress(FileNotFoundError):
                self.local.unlink()
            return
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self.path)


def may_clean(root: Path) -> bool:
    """Whether this process may remove interrupted writes under the local folder `root`:
    no run holds a lease on it, or this process does (never another run's writes)."""
    try:
        data = (root / LEASE_FILE).read_bytes()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    holder = LeaseHolder.from_bytes(data)
    with _HELD_LOCK:
        return holder is not None and holder.token in _HELD


def read_lease(policy: Checkpoint | str | os.PathLike[str]) -> LeaseHolder | None:
    """The holder of a checkpoint location's lease, or None when no run holds it.

    Args:
        policy: the run's `Checkpoint`, or its location (a path or an fsspec URL).
    """
    if not isinstance(policy, Checkpoint):
        policy = Checkpoint(os.fspath(policy))
    data = _LeaseFile(policy).read()
    return None if data is None else LeaseHolder.from_bytes(data)


class RunLease:
    """The lease one run holds on its checkpoint location (see the module docstring).

    Args:
        policy: the run's checkpoint policy (its location and `lease_timeout`).
        fingerprint: `plan_fingerprint` of the run's plan, recorded for readers.
    """

    def __init__(self, policy: Checkpoint, fingerprint: str):
        self.policy = policy
        self.timeout = float(policy.lease_timeout or 0.0)
        self.interval = min(15.0, max(0.05, self.timeout / 8))
        self.fingerprint = fingerprint
        self._file = _LeaseFile(policy)
        self._holder: LeaseHolder | None = None
        self._lost: LeaseHolder | None = None
        self._lost_reason = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def held(self) -> bool:
        """Whether this run holds the lease now (taken and not lost)."""
        return self._holder is not None and self._lost is None and not self._lost_reason

    def _refusal(self, holder: LeaseHolder | None) -> LeaseError:
        who = "another run holds it" + (f" ({holder.describe()})" if holder else "")
        if holder is not None and holder.pid == os.getpid() and holder.host == socket.gethostname():
            who = (
                f"an earlier run in this process holds it ({holder.describe()}; an "
                "`OnlineTrainer` holds its location until `close()`)"
            )
        return LeaseError(
            f"Received: checkpoint={self.policy.location!r}, but {who}. Stop that run, or "
            "pass a different checkpoint location (`pipekit-train checkpoint lease "
            "LOCATION` shows the holder)."
        )

    def acquire(self) -> None:
        """Take the lease (or a dead holder's) and start the heartbeat.

        Raises:
            LeaseError: a live run holds the location.
            CheckpointError: the location cannot be written (nothing was done).
        """
        try:
            self._acquire()
        except CheckpointError:
            raise
        except Exception as err:
            raise CheckpointError(
                f"Could not take the run lease on {self.policy.location} "
                f"({type(err).__name__}: {err}). Received: checkpoint="
                f"{self.policy.location!r}. Make the location reachable and writable, or "
                "pass Checkpoint(lease_timeout=None) to run without a lease."
            ) from err

    def _acquire(self) -> None:
        now = time.time()
        mine = LeaseHolder(
            host=socket.gethostname(),
            pid=os.getpid(),
            token=uuid.uuid4().hex,
            fingerprint=self.fingerprint,
            started=now,
            heartbeat=now,
            job=scheduler_job(),
        )
        for _ in range(3):
            if self._file.create(mine.to_bytes()):
                break
            data = self._file.read()
            if data is None:
                continue  # released meanwhile: try again
            current = LeaseHolder.from_bytes(data)
            if current is None:
                # a half-written file: its writer is creating it right now
                time.sleep(0.05)
                data = self._file.read()
                current = None if data is None else LeaseHolder.from_bytes(data)
                if current is None and data is not None:
                    raise self._refusal(None)
                if current is None:
                    continue
            reason = takeover_reason(current, timeout=self.timeout)
            if reason is None and self._same_job_here(current):
                reason = self._await_exit(current)
            if reason is None:
                raise self._refusal(current)
            self._file.replace(mine.to_bytes())
            if self._file.read() != mine.to_bytes():  # another run took it over first
                data = self._file.read()
                raise self._refusal(None if data is None else LeaseHolder.from_bytes(data))
            _log.warning(
                "Took over the checkpoint location %s from a dead run (%s): %s.",
                self.policy.location,
                current.describe(),
                reason,
            )
            break
        else:
            data = self._file.read()
            raise self._refusal(None if data is None else LeaseHolder.from_bytes(data))
        self._holder = mine
        with _HELD_LOCK:
            _HELD[mine.token] = self.policy.location
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="pipekit-lease", daemon=True)
        self._thread.start()

    @staticmethod
    def _same_job_here(holder: LeaseHolder) -> bool:
        job = scheduler_job()
        return (
            job is not None
            and holder.job == job
            and holder.host == socket.gethostname()
            and holder.pid != os.getpid()
        )

    def _await_exit(self, holder: LeaseHolder) -> str | None:
        """A restart of this scheduler job on the holder's host: the old process is being
        stopped (a restarted worker group); wait up to 30 s for it to end."""
        deadline = time.monotonic() + min(30.0, self.timeout)
        while time.monotonic() < deadline:
            if not _pid_alive(holder.pid):
                return (
                    f"it is the same scheduler job ({holder.job}), restarted, and its process ended"
                )
            time.sleep(0.1)
        return None

    def _still_ours(self) -> bool:
        """Read the file; record a loss if another run holds it now."""
        assert self._holder is not None
        data = self._file.read()
        if data is None and self._file.create(self._holder.to_bytes()):
            # the file was removed (a cleaned folder) and no other run took it: ours again
            _log.warning("The lease file of %s was removed; retook it.", self.policy.location)
            return True
        current = None if data is None else LeaseHolder.from_bytes(data)
        if current is not None and current.token == self._holder.token:
            return True
        self._lost = current
        self._lost_reason = "taken over" if current is not None else "removed"
        return False

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            holder = self._holder
            if holder is None or not self.held:
                return
            try:
                if not self._still_ours():
                    return
                renewed = LeaseHolder(**{**asdict(holder), "heartbeat": time.time()})
                self._file.replace(renewed.to_bytes())
                self._holder = renewed
            except Exception as err:  # a full disk or a lost network: retried next beat
                _log.debug("The lease heartbeat failed (%r); retrying.", err)

    def check(self) -> None:
        """Raise `LeaseError` if this run no longer holds its location (before a save)."""
        if self._holder is None:
            return
        if not self._lost_reason:
            try:
                self._still_ours()
            except Exception:  # unreachable now: the save itself reports it
                return
        if self._lost_reason:
            by = f" by another run ({self._lost.describe()})" if self._lost else ""
            raise LeaseError(
                f"This run lost its lease on {self.policy.location}: it was "
                f"{self._lost_reason}{by}, probably after this run stalled for more than "
                f"lease_timeout={self.timeout:g} s. It stops saving so that it never writes "
                "into the other run's steps. Received: checkpoint="
                f"{self.policy.location!r}. Let the other run finish, or raise "
                "Checkpoint(lease_timeout=...)."
            )

    def release(self) -> None:
        """Stop the heartbeat and remove the lease file if it is still this run's."""
        holder, self._holder = self._holder, None
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        if holder is None:
            return
        with _HELD_LOCK:
            _HELD.pop(holder.token, None)
        with contextlib.suppress(Exception):
            data = self._file.read()
            current = None if data is None else LeaseHolder.from_bytes(data)
            if current is not None and current.token == holder.token:
                self._file.remove()


@contextlib.contextmanager
def holding(policy: Checkpoint, fingerprint: str) -> Iterator[RunLease]:
    """Hold the lease on `policy`'s location for the block."""
    lease = RunLease(policy, fingerprint)
    lease.acquire()
    try:
        yield lease
    finally:
        lease.release()
