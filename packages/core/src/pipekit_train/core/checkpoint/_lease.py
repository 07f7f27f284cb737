"""The run lease: one run per checkpoint location, with a generation that fences writes.

A run holds a lease on its checkpoint location from before its first piece of work until
it ends (finish, abort, preemption), so that two runs never write into one location.

- **Records** (`_lease_records`): each taking of the lease creates the record of the next
  generation under `<location>/.pipekit-lease/` with one exclusive create (a hard link of
  a fully written file locally, `If-None-Match: *` on S3, `ifGenerationMatch=0` on GCS).
  The newest generation is the lease; exactly one of two racing runs creates it. A record
  is rewritten only by its own holder (heartbeat, release), so a holder that stalls and
  wakes after a takeover writes into its own older record and cannot undo the takeover.
- **Taking it** (`RunLease.acquire`): read the newest record (`inspect_lease`, which the
  lease command prints too); a live holder refuses the run at once (`LeaseError`); a free
  location, a released or dead holder (`takeover_reason`, the rules table in
  `_lease_rules`) or an unreadable record older than `lease_timeout` is taken by creating
  the next generation.
- **Fencing** (`_fencing`): the new record carries the fence `(generation, newest
  committed step)`; every commit records its generation, and a step an older generation
  commits past the fence is void: never resumed, removed by the holder.
- **The heartbeat**: a daemon thread rewrites the record every `lease_timeout / 8` s (at
  most 15 s) and notices a newer generation; the holder's next save then fails with
  `LeaseError` instead of writing into the new holder's steps.

Clocks: a heartbeat is compared with the reader's wall clock, so hosts that share a
location should keep their clocks in sync (NTP); the default lease time (120 s) leaves
room for the usual skew.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipekit_train.core._errors import CheckpointError

from ._fencing import Fencing, add_fence
from ._lease_records import LEASE_DIR, LeaseRecords, lease_records
from ._lease_rules import LeaseHolder, scheduler_job, takeover_reason
from ._policy import Checkpoint

__all__ = [
    "LEASE_DIR",
    "LeaseError",
    "LeaseHolder",
    "LeaseState",
    "RunLease",
    "fencing_of",
    "held_fencing",
    "inspect_lease",
    "lost_lease",
    "may_clean",
    "plan_fingerprint",
    "read_lease",
]

_log = logging.getLogger("pipekit_train.lease")
_TIMEOUT = 120.0  # `Checkpoint.lease_timeout`'s default: how readers judge a holder

# the leases this process holds now (token → lease)
_HELD: dict[str, RunLease] = {}
_HELD_LOCK = threading.Lock()

# test hooks: a named point of the lease's work calls `_FAILPOINTS[name]()` when set
# (`pipekit_train.core.testing.lease_failpoint` sets them: stall, kill, fail a write)
_FAILPOINTS: dict[str, Callable[[], None]] = {}


def _failpoint(name: str) -> None:
    hook = _FAILPOINTS.get(name)
    if hook is not None:
        hook()


class LeaseError(CheckpointError):
    """Another run holds the checkpoint location, or this run lost its lease to another."""


def plan_fingerprint(resume_key: Mapping[str, Any]) -> str:
    """A short digest of a plan's resume key: equal for runs that may share checkpoints."""
    text = json.dumps(resume_key, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class LeaseState:
    """A location's lease as the next run would find it.

    Attributes:
        generation: the newest generation (0: never taken).
        holder: the newest record, or None (none, or unreadable).
        status: `"free"` (never taken, or released), `"stale"` (the next run takes it
            over: `reason` says why) or `"held"` (the next run is refused).
        reason: why it is free or stale; for an unreadable record, what is known of it.
        unreadable_age: the age of an unreadable newest record (seconds), else None.
    """

    generation: int
    holder: LeaseHolder | None
    status: str
    reason: str | None = None
    unreadable_age: float | None = None

    @property
    def may_take(self) -> bool:
        """Whether a run started now would take the lease."""
        return self.status != "held"

    def describe(self) -> str:
        """One phrase naming the holder (or the unreadable record)."""
        if self.holder is not None:
            return self.holder.describe()
        if self.unreadable_age is not None:
            return (
                f"an unreadable lease record of generation {self.generation}, written "
                f"{self.unreadable_age:.0f} s ago"
            )
        return "no run"


def inspect_lease(records: LeaseRecords, *, timeout: float, now: float | None = None) -> LeaseState:
    """Read the newest record and judge it by the takeover rules (`_lease_rules`)."""
    for _ in range(5):
        generations = records.generations()
        if not generations:
            return LeaseState(0, None, "free", "no run has held it")
        top = generations[-1]
        data = records.read(top)
        if data is None:
            continue  # removed between the listing and the read: list again
        now_ = time.time() if now is None else now
        holder = LeaseHolder.from_bytes(data)
        if holder is None:
            modified = records.modified(top)
            age = 0.0 if modified is None else max(0.0, now_ - modified)
            if modified is not None and age > timeout:
                return LeaseState(
                    top,
                    None,
                    "stale",
                    f"its record is unreadable and {age:.0f} s old (lease_timeout={timeout:g} s)",
                    age,
                )
            return LeaseState(
                top,
                None,
                "held",
                "its record is unreadable (damaged, or half written); it is taken over once "
                f"it is older than lease_timeout={timeout:g} s",
                age,
            )
        with _HELD_LOCK:
            ours = holder.token in _HELD
        reason = takeover_reason(holder, timeout=timeout, now=now_, held=ours)
        if holder.released:
            return LeaseState(top, holder, "free", reason)
        return LeaseState(top, holder, "held" if reason is None else "stale", reason)
    raise CheckpointError(
        f"The lease records under {records.root} keep changing while being read. Retry."
    )


def read_lease(policy: Checkpoint | str | os.PathLike[str]) -> LeaseHolder | None:
    """The holder of a checkpoint location's lease, or None when no run holds it.

    A released lease is None; an unreadable record is reported by `inspect_lease`.

    Args:
        policy: the run's `Checkpoint`, or its location (a path or an fsspec URL).
    """
    if not isinstance(policy, Checkpoint):
        policy = Checkpoint(os.fspath(policy), lease_timeout=None)
    state = inspect_lease(lease_records(policy), timeout=float(policy.lease_timeout or _TIMEOUT))
    return None if state.holder is None or state.holder.released else state.holder


def held_fencing(policy: Checkpoint) -> Fencing:
    """This process's generation and fences at `policy`'s location when it holds the
    lease there, else an empty `Fencing` (no storage is read)."""
    location = policy.location
    with _HELD_LOCK:
        for lease in _HELD.values():
            holder = lease.holder
            if lease.location == location and holder is not None:
                return Fencing(holder.generation, holder.fences)
    return Fencing()


def lost_lease(policy: Checkpoint) -> LeaseError | None:
    """When this process held the lease at `policy`'s location and another run took it
    over since, the `LeaseError` that says so (a failed write reports it), else None."""
    location = policy.location
    with _HELD_LOCK:
        leases = [lease for lease in _HELD.values() if lease.location == location]
    for lease in leases:
        error = lease.lost_error()
        if error is not None:
            return error
    return None


def fencing_of(policy: Checkpoint) -> Fencing:
    """The fencing a store applies at `policy`'s location: this process's generation when
    it holds the lease, else the newest record's fences (a reader, a non-chief process)."""
    held = held_fencing(policy)
    if held.generation is not None:
        return held
    records = lease_records(policy)
    generations = records.generations()
    if not generations:
        return Fencing()
    data = records.read(generations[-1])
    holder = None if data is None else LeaseHolder.from_bytes(data)
    return Fencing(None, holder.fences if holder is not None else ())


def may_clean(root: Path) -> bool:
    """Whether this process may remove interrupted writes under the local folder `root`:
    no run holds its lease, or this process does (never another run's writes)."""
    policy = Checkpoint(root, lease_timeout=None)
    records = lease_records(policy)
    try:
        generations = records.generations()
        if not generations:
            return True
        data = records.read(generations[-1])
    except OSError:
        return False
    holder = None if data is None else LeaseHolder.from_bytes(data)
    if holder is None:
        return False
    with _HELD_LOCK:
        return holder.released or holder.token in _HELD


class RunLease:
    """The lease one run holds on its checkpoint location (see the module docstring).

    Args:
        policy: the run's checkpoint policy (its location and `lease_timeout`).
        fingerprint: `plan_fingerprint` of the run's plan, recorded for readers.
        committed: `() -> newest committed step or None`, read when the lease is taken:
            the fence of the new generation. None: no fence is recorded.
    """

    def __init__(
        self,
        policy: Checkpoint,
        fingerprint: str,
        *,
        committed: Callable[[], int | None] | None = None,
    ):
        self.policy = policy
        self.location = policy.location
        self.timeout = float(policy.lease_timeout or 0.0)
        self.interval = min(15.0, max(0.05, self.timeout / 8))
        self.fingerprint = fingerprint
        self._committed = committed
        self._records = lease_records(policy)
        self.holder: LeaseHolder | None = None
        self._lost: LeaseState | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def held(self) -> bool:
        """Whether this run holds the lease now (taken and not lost)."""
        return self.holder is not None and self._lost is None

    @property
    def generation(self) -> int | None:
        """The generation this run holds (None before `acquire`)."""
        return None if self.holder is None else self.holder.generation

    def _refusal(self, state: LeaseState) -> LeaseError:
        holder = state.holder
        who = f"another run holds it ({state.describe()})"
        with _HELD_LOCK:
            ours = holder is not None and holder.token in _HELD
        if holder is not None and ours:
            who = (
                f"an earlier run in this process holds it ({holder.describe()}; an "
                "`OnlineTrainer` holds its location until `close()`)"
            )
        elif holder is None and state.reason:
            who = f"{who}: {state.reason}"
        return LeaseError(
            f"Received: checkpoint={self.location!r}, but {who}. Stop that run, or pass a "
            "different checkpoint location (`pipekit-train checkpoint lease LOCATION` shows "
            "the holder)."
        )

    def acquire(self) -> None:
        """Take the lease (or a dead holder's) and start the heartbeat.

        Raises:
            LeaseError: a live run holds the location.
            CheckpointError: the location cannot be written, or its store ignores
                conditional writes (nothing was done).
        """
        try:
            self._acquire()
        except CheckpointError:
            raise
        except Exception as err:
            raise CheckpointError(
                f"Could not take the run lease on {self.location} "
                f"({type(err).__name__}: {err}). Received: checkpoint={self.location!r}. "
                "Make the location reachable and writable, or pass "
                "Checkpoint(lease_timeout=None) to run without a lease."
            ) from err

    def _acquire(self) -> None:
        self._records.probe()
        token = uuid.uuid4().hex
        for _ in range(5):
            state = inspect_lease(self._records, timeout=self.timeout)
            if state.status == "held" and state.holder is not None:
                ended = self._await_exit(state.holder)
                if ended is not None:
                    state = replace(state, status="stale", reason=ended)
            if state.status == "held":
                raise self._refusal(state)
            previous = state.holder.fences if state.holder is not None else ()
            generation = state.generation + 1
            fences = previous
            if self._committed is not None:
                step = self._committed()
                fences = add_fence(previous, generation, -1 if step is None else step)
            mine = LeaseHolder.here(
                token=token, fingerprint=self.fingerprint, generation=generation, fences=fences
            )
            _failpoint("acquire:create")
            if self._records.create(generation, mine.to_bytes()):
                break
            # another run created this generation first: read what it holds
        else:
            raise self._refusal(inspect_lease(self._records, timeout=self.timeout))
        if state.status == "stale":
            _log.warning(
                "Took over the checkpoint location %s from %s (%s); this run holds generation %d.",
                self.location,
                state.describe(),
                state.reason,
                generation,
            )
        self.holder = mine
        with _HELD_LOCK:
            _HELD[mine.token] = self
        self._records.sweep(generation, tmp_older_than=max(60.0, self.timeout))
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="pipekit-lease", daemon=True)
        self._thread.start()

    def _await_exit(self, holder: LeaseHolder) -> str | None:
        """The same scheduler job on this host and pid space (a worker group being
        restarted, e.g. by Ray): wait up to 30 s for the old process to end."""
        job, _ = scheduler_job()
        if job is None or holder.job != job or not holder.same_process_space():
            return None
        if holder.pid == os.getpid():
            return None
        deadline = time.monotonic() + min(30.0, self.timeout / 2)
        while time.monotonic() < deadline:
            reason = takeover_reason(holder, timeout=self.timeout)
            if reason is not None:
                return f"it is the same scheduler job ({job}) and {reason}"
            time.sleep(0.1)
        return None

    def _still_ours(self) -> bool:
        """Whether the newest generation is still this run's; record a loss if not."""
        assert self.holder is not None
        mine = self.holder.generation
        for _ in range(3):
            generations = self._records.generations()
            top = generations[-1] if generations else 0
            if top == mine:
                # the record is this run's (a store that did not honour the exclusive
                # create could have let another run write this generation too)
                data = self._records.read(mine)
                current = None if data is None else LeaseHolder.from_bytes(data)
                if current is None or current.token == self.holder.token:
                    return True
                self._lost = inspect_lease(self._records, timeout=self.timeout)
                return False
            if top > mine:
                self._lost = inspect_lease(self._records, timeout=self.timeout)
                return False
            # the records were removed (a cleaned folder) and no run took the location
            if self._records.create(mine, self.holder.to_bytes()):
                _log.warning("The lease records of %s were removed; retook them.", self.location)
                return True
        return False

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            holder = self.holder
            if holder is None or not self.held:
                return
            try:
                if not self._still_ours():
                    return
                _failpoint("heartbeat:read")
                renewed = replace(holder, heartbeat=time.time())
                self._records.write(renewed.generation, renewed.to_bytes())
                self.holder = renewed
            except Exception as err:  # a full disk or a lost network: retried next beat
                _log.debug("The lease heartbeat failed (%r); retrying.", err)

    def check(self) -> None:
        """Raise `LeaseError` if this run no longer holds its location (before a save)."""
        error = self.lost_error()
        if error is not None:
            raise error

    def lost_error(self) -> LeaseError | None:
        """The `LeaseError` to raise when this run no longer holds its location, else None
        (also None when the location cannot be read now: the save reports that)."""
        if self.holder is None:
            return None
        if self._lost is None:
            try:
                self._still_ours()
            except Exception:
                return None
        if self._lost is None:
            return None
        return LeaseError(
            f"This run lost its lease on {self.location}: generation "
            f"{self.holder.generation} was taken over by another run "
            f"({self._lost.describe()}), probably after this run stalled for more than "
            f"lease_timeout={self.timeout:g} s. It stops saving so that it never writes "
            f"into the other run's steps. Received: checkpoint={self.location!r}. Let "
            "the other run finish, or raise Checkpoint(lease_timeout=...)."
        )

    @property
    def fencing(self) -> Fencing:
        """This run's generation and fences."""
        assert self.holder is not None
        return Fencing(self.holder.generation, self.holder.fences)

    def release(self) -> None:
        """Stop the heartbeat and mark this run's record released."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        holder, self.holder = self.holder, None
        if holder is None:
            return
        with _HELD_LOCK:
            _HELD.pop(holder.token, None)
        with contextlib.suppress(Exception):
            done = replace(holder, heartbeat=time.time(), released=True)
            self._records.write(holder.generation, done.to_bytes())


@contextlib.contextmanager
def holding(policy: Checkpoint, fingerprint: str) -> Iterator[RunLease]:
    """Hold the lease on `policy`'s location for the block."""
    lease = RunLease(policy, fingerprint)
    lease.acquire()
    try:
        yield lease
    finally:
        lease.release()
