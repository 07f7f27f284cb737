"""Fault tests of the run lease, with real processes: each would have caught a hole.

- a process killed between writing its record and making it visible, and a full disk
  while writing it, leave the location free (a new run starts at once);
- an unreadable record is taken over after the lease time, and the lease command and
  `acquire` agree on every state;
- two takeovers of one dead holder: exactly one wins (at once, and one after the other);
- a holder that stalls between its heartbeat's read and write cannot undo a takeover;
- a pid reused by another process, a live pid whose heartbeat stopped, and a holder on
  another "host" with the same name (another pid space) are judged by the rules table;
- a run taken over while stalled at a save never becomes the resumed state (randomized
  trials: its late step is void, the resumed weights are the new holder's).

Local folders, and moto's S3 on loopback where the store matters.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipekit_train.core import Checkpoint, TrainingLoop
from pipekit_train.core.checkpoint._lease import (
    LEASE_DIR,
    LeaseError,
    RunLease,
    inspect_lease,
    read_lease,
)
from pipekit_train.core.checkpoint._lease_records import lease_records
from pipekit_train.core.checkpoint._lease_rules import LeaseHolder, pid_space, process_started
from pipekit_train.core.checkpoint._store import FencedStepWarning
from pipekit_train.core.testing import NumpyLinearOp, regression_task
from pipekit_train.core.testing._fork_server import spawn_python
from pipekit_train.core.testing._lease import stall_and_take_over
from pipekit_train.core.testing._smallfs import SmallFilesystemUnavailable, small_filesystem
from pipekit_train.core.testing._worker import LEASE_LOST_EXIT

TIMEOUT = 1.0  # the lease time of these tests (heartbeat every 0.125 s)
AGREE_TIMEOUT = 5.0  # the command-and-acquire agreement: no state may age in between

CHILD = r"""
import json, os, sys, time
from pathlib import Path
from pipekit_train.core import Checkpoint, LeaseError
from pipekit_train.core.checkpoint._lease import RunLease
from pipekit_train.core.testing._lease import lease_failpoint, stop_self

spec = json.loads(sys.argv[1])
if spec.get("failpoint"):
    if spec["action"] == "stop":
        action = stop_self(spec["marker"], on_call=spec.get("on_call", 1))
    else:  # "wait": a barrier the test opens by creating `go`
        def action():
            Path(spec["marker"]).write_text(str(os.getpid()))
            while not Path(spec["go"]).exists():
                time.sleep(0.005)
    lease_failpoint(spec["failpoint"], action)
policy = Checkpoint(
    spec["directory"], lease_timeout=spec["timeout"], storage_options=spec.get("storage_options")
)
lease = RunLease(policy, "child")
try:
    lease.acquire()
except LeaseError as err:
    print(json.dumps({"refused": str(err)}), flush=True)
    sys.exit(1)
except Exception as err:
    print(json.dumps({"error": f"{type(err).__name__}: {err}"}), flush=True)
    sys.exit(2)
print(json.dumps({"generation": lease.generation, "token": lease.holder.token}), flush=True)
lost, end = None, time.monotonic() + spec.get("hold", 0.0)
while time.monotonic() < end:
    try:
        lease.check()
    except LeaseError as err:
        lost = str(err)
        time.sleep(0.5)  # a woken heartbeat thread finishes what it was doing
        break
    time.sleep(0.05)
print(json.dumps({"lost": lost}), flush=True)
if lost is None:
    lease.release()
sys.exit(3 if lost else 0)
"""


pytestmark = pytest.mark.usefixtures("no_scheduler")


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    for module in ("moto.server", "boto3", "s3fs"):
        pytest.importorskip(module)
    from pipekit_train.core.testing._s3 import loopback_s3

    with loopback_s3("pipekit-lease-faults") as server:
        yield server


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.slow)])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any] | None]:
    """A fresh checkpoint location: a local folder, or a prefix on moto's S3."""
    if request.param == "local":
        return str(tmp_path / "ck"), None
    server = request.getfixturevalue("s3")
    return f"s3://pipekit-lease-faults/{uuid.uuid4().hex[:10]}/ck", server.storage_options


def _policy(where: tuple[str, dict[str, Any] | None], timeout: float = TIMEOUT) -> Checkpoint:
    return Checkpoint(where[0], lease_timeout=timeout, storage_options=where[1])


def _child(spec: dict[str, Any]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(spec)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _spec(where: tuple[str, dict[str, Any] | None], **kw: Any) -> dict[str, Any]:
    return {"directory": where[0], "storage_options": where[1], "timeout": TIMEOUT, **kw}


def _wait_for(path: Path, proc: subprocess.Popen[str], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the child ended early: {proc.communicate()[1][-3000:]}")
        assert time.monotonic() < deadline, f"the child never reached {path.name}"
        time.sleep(0.01)


def _lines(proc: subprocess.Popen[str], timeout: float = 60) -> list[dict[str, Any]]:
    out, err = proc.communicate(timeout=timeout)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert lines, err[-3000:]
    return lines


def _cli(location: str, options: dict[str, Any] | None, timeout: float = TIMEOUT) -> int:
    from pipekit_train.core.cli._lease_cmd import checkpoint_lease

    with open(os.devnull, "w") as sink:
        return checkpoint_lease(location, storage_options=options, lease_timeout=timeout, out=sink)


def _write_record(where: tuple[str, dict[str, Any] | None], holder: LeaseHolder) -> None:
    records = lease_records(_policy(where))
    records.write(holder.generation, holder.to_bytes())


def _holder(**kw: Any) -> LeaseHolder:
    now = time.time()
    base: dict[str, Any] = dict(
        host=socket.gethostname(),
        pid=os.getppid(),
        token=uuid.uuid4().hex,
        fingerprint="f" * 12,
        started=now - 60,
        heartbeat=now,
        generation=1,
        pid_space=pid_space(),
        pid_started=process_started(os.getppid()),
    )
    base.update(kw)
    return LeaseHolder(**base)


def _dead_pid() -> int:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(proc.stdout)


# -------------------------------------------------------------------- creating a record
def test_a_kill_between_writing_and_linking_the_record_leaves_the_location_free(
    tmp_path: Path,
) -> None:
    """The child writes its record, then is killed before the record becomes visible
    (with `O_CREAT | O_EXCL` and a write, the old create left an empty file that refused
    every later run for good)."""
    where = (str(tmp_path / "ck"), None)
    marker = tmp_path / "linking"
    child = _child(_spec(where, failpoint="create:link", action="stop", marker=str(marker)))
    _wait_for(marker, child)
    child.kill()
    child.wait()
    state = inspect_lease(lease_records(_policy(where)), timeout=TIMEOUT)
    assert state.status == "free" and state.generation == 0, state
    assert _cli(where[0], None) == 0
    leftovers = sorted((tmp_path / "ck" / LEASE_DIR).iterdir())
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".tmp-000000000001.json.")
    t0 = time.monotonic()
    lease = RunLease(_policy(where), "next")
    lease.acquire()  # at once: nothing holds the location
    try:
        assert time.monotonic() - t0 < 1.0 and lease.generation == 1
    finally:
        lease.release()
    os.utime(leftovers[0], (time.time() - 600, time.time() - 600))
    again = RunLease(_policy(where), "again")
    again.acquire()  # a later holder sweeps the killed writer's old temporary file
    again.release()
    names = sorted(p.name for p in (tmp_path / "ck" / LEASE_DIR).iterdir())
    assert names == ["000000000002.json"], names


def test_a_full_disk_while_writing_the_record_leaves_the_location_free(tmp_path: Path) -> None:
    """ENOSPC from a real full filesystem: the child's acquire fails with the disk's error
    and leaves no record; once there is room a new run starts at once."""
    small = tmp_path / "small"
    try:
        mounted = small_filesystem(small, "64k")
        mounted.__enter__()
    except SmallFilesystemUnavailable as exc:
        pytest.skip(f"a tmpfs cannot be mounted here: {exc}")
    try:
        (small / "ck" / LEASE_DIR).mkdir(parents=True)
        filler = small / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:  # fill every page of the filesystem
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * 4096)
        finally:
            os.close(fd)
        where = (str(small / "ck"), None)
        child = _child(_spec(where))
        (line,) = _lines(child)
        assert child.returncode == 2 and "No space left on device" in line["error"], line
        assert "Could not take the run lease" in line["error"]
        assert list((small / "ck" / LEASE_DIR).iterdir()) == []  # no record, no temporary
        assert _cli(where[0], None) == 0
        filler.unlink()
        lease = RunLease(_policy(where), "next")
        t0 = time.monotonic()
        lease.acquire()
        assert time.monotonic() - t0 < 1.0 and lease.generation == 1
        lease.release()
    finally:
        mounted.__exit__(None, None, None)


# -------------------------------------------------------------------- one story, two readers
def _states(where: tuple[str, dict[str, Any] | None]) -> list[tuple[str, Any, bool]]:
    """(name, how to plant it, whether the next run takes the location)."""
    live = os.getppid()
    dead = _dead_pid()
    other_space = "0" * 8 + "-another-container/pid:[4026532999]"
    now = time.time()
    return [
        ("free", None, True),
        ("released", _holder(released=True), True),
        ("live holder", _holder(), False),
        ("stale heartbeat", _holder(heartbeat=now - 30), True),
        ("dead process here", _holder(pid=dead, pid_started=None), True),
        ("pid reused", _holder(pid_started=(process_started(live) or 0) - 100), True),
        ("dead pid in another pid space", _holder(pid=dead, pid_space=other_space), False),
        ("another host", _holder(host="n12.cluster", pid=4711, pid_space=None), False),
        ("fresh unreadable record", b"", False),
        ("old unreadable record", b'{"host": "n1', True),
    ]


@pytest.mark.parametrize("index", range(10))
def test_the_lease_command_and_acquire_agree(
    where: tuple[str, dict[str, Any] | None], index: int
) -> None:
    """A lease time of 5 s: a fresh record stays fresh between the command and `acquire`
    on a loaded machine."""
    name, plant, takes = _states(where)[index]
    records = lease_records(_policy(where))
    if isinstance(plant, LeaseHolder):
        _write_record(where, plant)
    elif isinstance(plant, bytes):
        records.write(1, plant)
        if name.startswith("old") and where[1] is None:
            os.utime(records.path(1), (time.time() - 30, time.time() - 30))
        elif name.startswith("old"):  # S3 sets an object's time itself
            time.sleep(AGREE_TIMEOUT + 0.5)
    cli = _cli(where[0], where[1], AGREE_TIMEOUT)
    assert cli == (0 if takes else 1), name
    lease = RunLease(_policy(where, AGREE_TIMEOUT), "next")
    if takes:
        lease.acquire()
        try:
            assert lease.generation == (1 if plant is None else 2), name
        finally:
            lease.release()
    else:
        with pytest.raises(LeaseError, match="another run holds it") as info:
            lease.acquire()
        if isinstance(plant, bytes):
            assert "unreadable lease record of generation 1" in str(info.value)
            assert "taken over once it is older than lease_timeout=5 s" in str(info.value)
        assert records.generations() == [1], name  # refused: nothing written


# -------------------------------------------------------------------- racing takeovers
@pytest.mark.parametrize("order", ["together", "one after the other"])
def test_two_takeovers_of_one_dead_holder_let_exactly_one_in(
    where: tuple[str, dict[str, Any] | None], tmp_path: Path, order: str
) -> None:
    """Both children judge the holder dead, then stop before they write; released at once
    or one after the other, exactly one holds generation 2 and the other is refused."""
    _write_record(
        where, _holder(host="n12.cluster", pid=4711, pid_space=None, heartbeat=time.time() - 60)
    )
    children = []
    for i in range(2):
        spec = _spec(
            where,
            failpoint="acquire:create",
            action="wait",
            marker=str(tmp_path / f"ready{i}"),
            go=str(tmp_path / (f"go{i}" if order != "together" else "go")),
            hold=3.0,  # the winner still holds when the loser reads it, on a loaded machine
        )
        children.append(_child(spec))
    for i, child in enumerate(children):
        _wait_for(tmp_path / f"ready{i}", child)
    if order == "together":
        (tmp_path / "go").touch()
        results = [_lines(c) for c in children]
    else:
        (tmp_path / "go0").touch()
        first = children[0]
        assert first.stdout is not None
        took = json.loads(first.stdout.readline())
        assert took.get("generation") == 2, took
        (tmp_path / "go1").touch()
        second = _lines(children[1])
        out, _ = first.communicate(timeout=60)
        results = [[took, *[json.loads(x) for x in out.splitlines() if x]], second]
    winners = [r for r in results if "generation" in r[0]]
    losers = [r for r in results if "refused" in r[0]]
    assert len(winners) == 1 and len(losers) == 1, results
    assert winners[0][0]["generation"] == 2 and winners[0][-1] == {"lost": None}
    assert "generation 2" in losers[0][0]["refused"], losers
    records = lease_records(_policy(where))
    assert records.generations()[-1] == 2
    holder = LeaseHolder.from_bytes(records.read(2) or b"")
    assert holder is not None and holder.token == winners[0][0]["token"] and holder.released


# -------------------------------------------------------------------- a stalled heartbeat
def test_a_heartbeat_stalled_between_read_and_write_cannot_undo_a_takeover(
    where: tuple[str, dict[str, Any] | None], tmp_path: Path
) -> None:
    """The holder stops between its heartbeat's read ("still mine") and its write; a new
    run takes over; the holder wakes and writes. The new run keeps the location, and the
    old one finds out it lost it (the old heartbeat overwrote the new holder's lease)."""
    marker = tmp_path / "stalled"
    old = _child(
        _spec(
            where,
            failpoint="heartbeat:read",
            action="stop",
            on_call=3,
            marker=str(marker),
            hold=60.0,
        )
    )
    assert old.stdout is not None
    first = json.loads(old.stdout.readline())
    assert first["generation"] == 1
    _wait_for(marker, old)
    new = RunLease(_policy(where), "new")
    deadline = time.monotonic() + 30
    while True:
        try:
            new.acquire()
            break
        except LeaseError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    try:
        assert new.generation == 2
        taken = time.time()
        os.kill(old.pid, signal.SIGCONT)
        out, err = old.communicate(timeout=60)
        assert old.returncode == 3, err[-3000:]
        lost = json.loads(out.splitlines()[-1])["lost"]
        assert "lost its lease" in lost and "generation 1 was taken over" in lost, lost
        new.check()  # still the new holder's
        holder = read_lease(_policy(where))
        assert holder is not None and holder.token == new.holder.token and holder.generation == 2
        records = lease_records(_policy(where))
        late = LeaseHolder.from_bytes(records.read(1) or b"")
        # the woken heartbeat wrote, into its own record, which no longer counts
        assert late is not None and late.token == first["token"] and late.heartbeat > taken
    finally:
        new.release()


# -------------------------------------------------------------------- who is dead
def test_a_reused_pid_and_a_stopped_heartbeat_are_taken_over(tmp_path: Path) -> None:
    """A record naming a live process: taken over at once when that pid now belongs to a
    process started later (reused), after the lease time when its heartbeat stopped, and
    never while it beats (the old rules never took a live pid on this host over)."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        started = process_started(other.pid)
        assert started is not None
        cases = [
            (
                "reused",
                _holder(pid=other.pid, pid_started=started - 100),
                True,
                "belongs to another process",
            ),
            (
                "silent",
                _holder(pid=other.pid, pid_started=started, heartbeat=time.time() - 8),
                True,
                "last heartbeat is 8 s old",
            ),
            ("beating", _holder(pid=other.pid, pid_started=started), False, None),
        ]
        for name, holder, takes, reason in cases:
            where = (str(tmp_path / name), None)
            _write_record(where, holder)
            state = inspect_lease(lease_records(_policy(where)), timeout=AGREE_TIMEOUT)
            assert state.may_take == takes, (name, state)
            if reason is not None:
                assert state.reason is not None and reason in state.reason, (name, state)
            lease = RunLease(_policy(where, AGREE_TIMEOUT), name)
            if takes:
                lease.acquire()
                lease.release()
            else:
                with pytest.raises(LeaseError, match=f"pid {other.pid}"):
                    lease.acquire()
    finally:
        other.kill()
        other.wait()


def test_two_hosts_with_one_name_wait_for_the_heartbeat(
    where: tuple[str, dict[str, Any] | None],
) -> None:
    """Another container with this host name (another pid namespace) holds the location
    with a pid that does not exist here: it is alive until its heartbeat is older than
    the lease time (the old rules took it over at once: "no longer exists on this host")."""
    holder = _holder(pid=_dead_pid(), pid_space="0" * 8 + "-another-container/pid:[4026532999]")
    _write_record(where, holder)
    with pytest.raises(LeaseError, match=f"pid {holder.pid}"):
        RunLease(_policy(where, 2.0), "here").acquire()
    time.sleep(2.3)
    lease = RunLease(_policy(where, 2.0), "here")
    lease.acquire()
    assert lease.generation == 2
    lease.release()


# -------------------------------------------------------------------- fenced writes
def _numpy_loop(**kw: Any) -> TrainingLoop:
    train, val = regression_task()
    base: dict[str, Any] = dict(
        model=NumpyLinearOp(
            "pipekit_train.core.testing._numpy_model:linear", in_size=4, out_size=1, seed=0
        ),
        data=train,
        validation=val,
        optimizer_config={"name": "adam", "lr": 0.05},
        batch_size=16,
        max_steps=20,
        seed=0,
        progress=False,
        preemption_signals=(),  # the trials run side by side in threads
    )
    base.update(kw)
    return TrainingLoop(**base)


def _numpy_spec() -> dict[str, Any]:
    model = NumpyLinearOp(
        "pipekit_train.core.testing._numpy_model:linear", in_size=4, out_size=1, seed=0
    )
    return {
        "model": model.get_config(),
        "adapter": None,
        "task": "regression",
        "optimizer_config": {"name": "adam", "lr": 0.05},
        "batch_size": 16,
        "seed": 0,
        "sys_path": [p for p in sys.path if p],
    }


def _spawn(spec_path: Path) -> Any:
    return spawn_python(
        ["-m", "pipekit_train.core.testing._worker", str(spec_path)],
        env=dict(os.environ),
        preload=("pipekit_train.core.testing",),
    )


TRIALS = int(os.environ.get("PIPEKIT_LEASE_TRIALS", "20"))


def _trial(trial: int, root: Path) -> tuple[int, int, Any]:
    rng = random.Random(1000 + trial)
    stall_save = rng.randint(2, 6)
    holder_steps = stall_save * 2 + rng.randint(-2, 3)
    workdir = root / f"trial{trial}"
    workdir.mkdir()
    result = stall_and_take_over(
        loop=_numpy_loop,
        spawn=_spawn,
        spec=_numpy_spec(),
        workdir=workdir,
        directory=str(workdir / "ck"),
        storage_options=None,
        stall_save=stall_save,
        holder_steps=holder_steps,
    )
    return trial, holder_steps, result


def test_a_run_taken_over_while_stalled_never_becomes_the_resumed_state(tmp_path: Path) -> None:
    """20 randomized trials, run side by side: the stalled run stops at a random save; the
    new holder trains to a random step, in about a third of the trials short of the stalled
    save (then the late step is the newest on disk). Whatever the stalled run writes after
    it wakes is void, and the run that resumes afterwards has the new holder's weights,
    which are an uninterrupted run's (SHA-256)."""
    from concurrent.futures import ThreadPoolExecutor

    _numpy_loop(max_steps=1).run()  # import what a run imports once, before the threads
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ThreadPoolExecutor(5) as pool:
            results = list(pool.map(lambda t: _trial(t, tmp_path), range(TRIALS)))
    fenced = [str(w.message) for w in caught if issubclass(w.category, FencedStepWarning)]
    dangerous = 0
    for trial, holder_steps, result in results:
        where = f"trial {trial}: {result}"
        assert result.stalled_exit == LEASE_LOST_EXIT, (where, result.stalled_stderr[-3000:])
        assert "lost its lease" in result.stalled_stderr, where
        assert result.resumed_from == result.stalled_at - 2, where
        assert result.final_resumed_from == holder_steps, where
        assert result.final_sha256 == result.holder_sha256 == result.reference_sha256, where
        # the late step (the save the stalled run was making) exists only when the holder
        # stopped short of it: then it was the newest step, skipped and removed
        late = (result.stalled_at,) if holder_steps < result.stalled_at else ()
        assert result.late_steps == late, where
        for step in late:
            path = str(tmp_path / f"trial{trial}" / "ck" / str(step))
            assert any(path in m and "never resumed" in m for m in fenced), (where, fenced)
            assert not Path(path).exists(), where
            dangerous += 1
    assert dangerous >= 4, dangerous  # the case fencing exists for was drawn
