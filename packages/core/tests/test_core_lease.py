"""The run lease: one run per checkpoint location (numpy backend, real processes).

The conformance suite checks the refusal and the takeover on every backend; here the
lease's own rules are checked in detail: who may take a location over, when, and what a
run that lost its location does.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipekit_train.core import (
    Checkpoint,
    CheckpointError,
    ConfigError,
    LambdaCallback,
    OnlineTrainer,
    TrainingLoop,
)
from pipekit_train.core.checkpoint import step_dirs
from pipekit_train.core.checkpoint._lease import (
    LEASE_DIR,
    LeaseError,
    LeaseHolder,
    RunLease,
    read_lease,
)
from pipekit_train.core.checkpoint._lease_rules import pid_space, process_started
from pipekit_train.core.testing import NumpyLinearOp, regression_task
from pipekit_train.core.testing._lease import plant_lease


def _loop(**kw: Any) -> TrainingLoop:
    train, val = regression_task()
    base: dict[str, Any] = dict(
        model=NumpyLinearOp(
            "pipekit_train.core.testing._numpy_model:linear", in_size=4, out_size=1
        ),
        data=train,
        validation=val,
        optimizer_config={"name": "adam", "lr": 0.05},
        batch_size=16,
        max_steps=20,
        validate_every_n_steps=8,
        progress=False,
    )
    base.update(kw)
    return TrainingLoop(**base)


def _holder(**kw: Any) -> LeaseHolder:
    now = time.time()
    pid = kw.get("pid", os.getppid())  # alive: the process that runs the tests' runner
    here = kw.get("host", socket.gethostname()) == socket.gethostname()
    base: dict[str, Any] = dict(
        host=socket.gethostname(),
        pid=pid,
        token=uuid.uuid4().hex,
        fingerprint="0123456789ab",
        started=now - 60,
        heartbeat=now - 1,
        job=None,
        generation=1,
        pid_space=pid_space() if here else None,
        pid_started=process_started(pid) if here else None,
    )
    base.update(kw)
    return LeaseHolder(**base)


def _plant(directory: Path, holder: LeaseHolder) -> None:
    fields = {k: v for k, v in holder.__dict__.items() if k not in ("pid", "host")}
    plant_lease(directory, holder.pid, host=holder.host, **fields)


pytestmark = pytest.mark.usefixtures("no_scheduler")


def test_a_live_holder_refuses_the_run_before_any_work(tmp_path: Path) -> None:
    directory = tmp_path / "ck"
    holder = _holder()
    _plant(directory, holder)
    started: list[int] = []
    loop = _loop(
        checkpoint=Checkpoint(directory, every_n_steps=5),
        callbacks=[LambdaCallback(on_train_start=lambda state: started.append(1))],
    )
    t0 = time.monotonic()
    with pytest.raises(LeaseError) as info:
        loop.run()
    assert time.monotonic() - t0 < 5
    message = str(info.value)
    assert f"Received: checkpoint={str(directory)!r}, but another run holds it" in message
    assert f"host {holder.host}, pid {holder.pid}" in message
    assert "last heartbeat 1 s ago" in message
    assert "Stop that run, or pass a different checkpoint location" in message
    assert started == []  # refused before the run began
    assert sorted(p.name for p in directory.iterdir()) == [LEASE_DIR]
    assert read_lease(Checkpoint(directory)) == holder  # the holder's lease is untouched


def test_the_lease_is_held_while_training_and_released_at_the_end(tmp_path: Path) -> None:
    policy = Checkpoint(tmp_path / "ck", every_n_steps=5)
    seen: list[Any] = []

    def on_step_end(state: Any) -> None:
        if state.step == 3:
            seen.append(read_lease(policy))

    art = _loop(checkpoint=policy, callbacks=[LambdaCallback(on_step_end=on_step_end)]).run()
    held = seen[0]
    assert held is not None and held.pid == os.getpid() and held.host == socket.gethostname()
    assert held.fingerprint and held.started <= held.heartbeat <= time.time()
    assert read_lease(policy) is None  # released: its record says so
    assert sorted(p.name for p in (tmp_path / "ck" / LEASE_DIR).iterdir()) == ["000000000001.json"]
    assert step_dirs(policy) == [10, 15, 20] and art.steps == 20


def test_a_second_run_in_the_same_process_is_refused_and_the_first_ends_alone(
    tmp_path: Path,
) -> None:
    """Two runs on one location at once (the second with another learning rate): the
    second is refused, the first ends with the bytes of a run alone."""
    policy = Checkpoint(tmp_path / "ck", every_n_steps=5, max_to_keep=None)
    errors: list[str] = []

    def on_step_end(state: Any) -> None:
        if state.step == 7:
            try:
                _loop(checkpoint=policy, optimizer_config={"name": "adam", "lr": 0.01}).run()
            except LeaseError as err:
                errors.append(str(err))

    first = _loop(checkpoint=policy, callbacks=[LambdaCallback(on_step_end=on_step_end)]).run()
    assert len(errors) == 1 and "an earlier run in this process holds it" in errors[0]
    alone = _loop().run()
    assert first.model.serialize_weights() == alone.model.serialize_weights()
    assert step_dirs(policy) == [5, 10, 15, 20]
    again = _loop(checkpoint=policy).run()  # the rerun finds the first run's steps
    assert again.resumed_from_step == 20
    assert again.model.serialize_weights() == alone.model.serialize_weights()


def test_a_dead_holder_on_this_host_is_taken_over_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead = _holder(pid=int(proc.stdout), heartbeat=time.time())  # a fresh heartbeat
    _plant(tmp_path / "ck", dead)
    with caplog.at_level(logging.WARNING, logger="pipekit_train.lease"):
        t0 = time.monotonic()
        art = _loop(checkpoint=Checkpoint(tmp_path / "ck", every_n_steps=10)).run()
    assert time.monotonic() - t0 < 10 and art.steps == 20
    taken = [r.getMessage() for r in caplog.records if "Took over" in r.getMessage()]
    assert len(taken) == 1, caplog.text
    assert f"pid {dead.pid}" in taken[0] and "no longer exists on this host" in taken[0]
    assert read_lease(Checkpoint(tmp_path / "ck")) is None


@pytest.mark.parametrize(("age", "taken"), [(30.0, False), (300.0, True)], ids=["fresh", "stale"])
def test_a_holder_on_another_host_is_taken_over_after_the_lease_time(
    tmp_path: Path, age: float, taken: bool
) -> None:
    _plant(tmp_path / "ck", _holder(host="n12.cluster", pid=4711, heartbeat=time.time() - age))
    loop = _loop(checkpoint=Checkpoint(tmp_path / "ck", every_n_steps=10, lease_timeout=120))
    if taken:
        assert loop.run().steps == 20
    else:
        with pytest.raises(
            LeaseError, match=r"host n12\.cluster, pid 4711.*last heartbeat 30 s ago"
        ):
            loop.run()


def test_a_restart_of_the_same_scheduler_job_takes_over_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A requeued SLURM job (elsewhere, the old heartbeat fresh, a higher restart count)
    continues at once; another job, another step of the same job, or the same step
    without a restart is refused."""
    holder = _holder(host="n12.cluster", pid=4711, job="slurm:81/3.batch", restart=0)
    _plant(tmp_path / "ck", holder)
    policy = Checkpoint(tmp_path / "ck", every_n_steps=10)
    monkeypatch.setenv("SLURM_JOB_ID", "99")
    with pytest.raises(LeaseError, match=r"job slurm:81/3\.batch"):
        _loop(checkpoint=policy).run()
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "81")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    monkeypatch.setenv("SLURM_STEP_ID", "1")  # another step of the same job
    with pytest.raises(LeaseError, match="another run holds it"):
        _loop(checkpoint=policy).run()
    monkeypatch.delenv("SLURM_STEP_ID")  # the same step, no restart
    with pytest.raises(LeaseError, match="another run holds it"):
        _loop(checkpoint=policy).run()
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert _loop(checkpoint=policy).run().steps == 20


def test_a_restarted_elastic_group_takes_over_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchelastic: the same run id with a higher `TORCHELASTIC_RESTART_COUNT` continues at
    once; the same restart count is another live process of the group (refused)."""
    holder = _holder(host="n12.cluster", pid=4711, job="torchelastic:r7", restart=2)
    _plant(tmp_path / "ck", holder)
    policy = Checkpoint(tmp_path / "ck", every_n_steps=10)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "r7")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    with pytest.raises(LeaseError, match="job torchelastic:r7"):
        _loop(checkpoint=policy).run()
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    assert _loop(checkpoint=policy).run().steps == 20


def test_a_run_that_lost_its_lease_stops_saving(tmp_path: Path) -> None:
    """Taken over after a stall: the next save fails with a clear error, and nothing of
    this run is written after the loss."""
    policy = Checkpoint(tmp_path / "ck", every_n_steps=5, max_to_keep=None, async_save=False)
    other = _holder(host="n12.cluster", pid=4711, generation=2)

    def on_step_end(state: Any) -> None:
        if state.step == 7:
            _plant(tmp_path / "ck", other)

    with pytest.raises(LeaseError) as info:
        _loop(checkpoint=policy, callbacks=[LambdaCallback(on_step_end=on_step_end)]).run()
    message = str(info.value)
    assert f"This run lost its lease on {policy.location}" in message
    assert "taken over by another run (host n12.cluster, pid 4711" in message
    assert step_dirs(policy) == [5]
    assert read_lease(policy) == other  # the new holder's lease is left alone


def test_the_heartbeat_renews_the_lease(tmp_path: Path) -> None:
    policy = Checkpoint(tmp_path / "ck", lease_timeout=0.4)
    lease = RunLease(policy, "abc")
    lease.acquire()
    try:
        first = read_lease(policy)
        time.sleep(0.3)
        later = read_lease(policy)
        assert first is not None and later is not None
        assert later.token == first.token and later.heartbeat > first.heartbeat
    finally:
        lease.release()
    assert read_lease(policy) is None


def test_two_processes_on_one_location(tmp_path: Path) -> None:
    """Real processes 0.2 s apart, different plans: the second exits non-zero within
    seconds with the holder named; the first ends with the weights of a run alone."""
    directory = tmp_path / "ck"
    script = tmp_path / "run.py"
    script.write_text(
        "import sys, time\n"
        "import numpy as np\n"
        "from pipekit_train.core import Checkpoint, LambdaCallback, TrainingLoop\n"
        "from pipekit_train.core.testing import NumpyLinearOp, regression_task\n"
        "train, val = regression_task()\n"
        "lr, out = float(sys.argv[1]), sys.argv[2]\n"
        "loop = TrainingLoop(\n"
        "    model=NumpyLinearOp('pipekit_train.core.testing._numpy_model:linear', in_size=4, out_size=1),\n"
        "    data=train, validation=val, optimizer_config={'name': 'adam', 'lr': lr},\n"
        "    batch_size=16, max_steps=20, validate_every_n_steps=8, progress=False,\n"
        f"    checkpoint=Checkpoint({str(directory)!r}, every_n_steps=5),\n"
        "    callbacks=[LambdaCallback(on_step_end=lambda s: time.sleep(0.1))],\n"
        ")\n"
        "art = loop.run()\n"
        "open(out, 'wb').write(art.model.serialize_weights())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    first = subprocess.Popen(
        [sys.executable, str(script), "0.05", str(tmp_path / "a.bin")],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (directory / LEASE_DIR).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    t0 = time.monotonic()
    second = subprocess.run(
        [sys.executable, str(script), "0.01", str(tmp_path / "b.bin")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    refused_after = time.monotonic() - t0
    _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err[-3000:]
    assert second.returncode != 0
    assert "LeaseError" in second.stderr and f"pid {first.pid}" in second.stderr
    assert "Stop that run, or pass a different checkpoint location" in second.stderr
    assert refused_after < 15, refused_after
    assert not (tmp_path / "b.bin").exists()
    alone = _loop().run()
    assert (tmp_path / "a.bin").read_bytes() == alone.model.serialize_weights()
    assert sorted(p.name for p in directory.iterdir()) == [LEASE_DIR, "10", "15", "20"]


def test_an_online_trainer_holds_its_location_until_closed(tmp_path: Path) -> None:
    policy = Checkpoint(tmp_path / "ck", every_n_steps=2)
    model = NumpyLinearOp("pipekit_train.core.testing._numpy_model:linear", in_size=4, out_size=1)
    batch = {"x": np.ones((4, 4), np.float32), "y": np.ones((4, 1), np.float32)}
    trainer = OnlineTrainer(model, optimizer_config={"name": "sgd", "lr": 0.1}, checkpoint=policy)
    trainer(batch)
    with pytest.raises(LeaseError, match="OnlineTrainer"):
        OnlineTrainer(model, optimizer_config={"name": "sgd", "lr": 0.1}, checkpoint=policy)
    trainer.close()
    assert read_lease(policy) is None
    again = OnlineTrainer(model, optimizer_config={"name": "sgd", "lr": 0.1}, checkpoint=policy)
    again.close()


def test_lease_timeout_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"Received: lease_timeout=0\..*lease_timeout=120"):
        Checkpoint(tmp_path / "ck", lease_timeout=0)
    no_lease = Checkpoint(tmp_path / "ck", every_n_steps=10, lease_timeout=None)
    _plant(tmp_path / "ck", _holder())
    assert _loop(checkpoint=no_lease).run().steps == 20  # no lease: the user's choice


def test_a_lease_file_survives_json_round_trip(tmp_path: Path) -> None:
    holder = _holder(job="slurm:1")
    assert LeaseHolder.from_bytes(holder.to_bytes()) == holder
    assert LeaseHolder.from_bytes(b"{half") is None
    assert json.loads(holder.to_bytes())["job"] == "slurm:1"


def test_the_cli_shows_who_holds_a_location(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipekit_train.core.cli import main

    directory = tmp_path / "ck"
    directory.mkdir()
    assert main(["checkpoint", "lease", str(directory)]) == 0
    assert "no run holds it" in capsys.readouterr().out
    holder = _holder(host="n12.cluster", pid=4711, heartbeat=time.time() - 600)
    _plant(directory, holder)
    assert main(["checkpoint", "lease", str(directory)]) == 0  # the next run takes it over
    out = capsys.readouterr().out
    assert "held by host n12.cluster, pid 4711" in out and "last heartbeat 600 s ago" in out
    assert "stale (its last heartbeat is 600 s old" in out
    assert main(["checkpoint", "lease", str(directory), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["holder"]["pid"] == 4711 and report["stale"].startswith("its last heartbeat")
    assert report["state"] == "stale" and report["generation"] == 1
    # the run's own lease time: with lease_timeout=1000 that holder is alive
    assert main(["checkpoint", "lease", str(directory), "--lease-timeout", "1000"]) == 1
    assert "stale" not in capsys.readouterr().out
    assert main(["checkpoint", "lease", str(directory), "--lease-timeout", "0"]) == 2
    assert "Received: lease_timeout=0.0" in capsys.readouterr().err
    _plant(directory, _holder(host="n12.cluster", pid=4711, generation=2))  # a live one
    assert main(["checkpoint", "lease", str(directory)]) == 1
    assert "held by host n12.cluster, pid 4711" in capsys.readouterr().out
    main(["checkpoint", "inspect", str(directory)])
    assert "held by a run: host n12.cluster, pid 4711" in capsys.readouterr().out


@pytest.fixture(scope="module")
def s3() -> Any:
    for module in ("moto.server", "boto3", "s3fs"):
        pytest.importorskip(module)
    from pipekit_train.core.testing._s3 import loopback_s3

    with loopback_s3("pipekit-lease") as server:
        yield server


def test_on_s3_the_lease_is_a_conditional_create(s3: Any, tmp_path: Path) -> None:
    """Two runs on one `s3://` location: the second is refused (S3's `If-None-Match`); a
    holder's lease is removed at its end; a dead holder is taken over."""
    uri = f"s3://pipekit-lease/{uuid.uuid4().hex[:8]}/ck"
    policy = Checkpoint(uri, every_n_steps=10, storage_options=s3.storage_options)
    first = RunLease(policy, "aaa")
    first.acquire()
    try:
        holder = read_lease(policy)
        assert holder is not None and holder.fingerprint == "aaa"
        second = RunLease(policy, "bbb")
        with pytest.raises(LeaseError, match=rf"Received: checkpoint='{uri}', but an earlier run"):
            second.acquire()
        with pytest.raises(LeaseError, match="an earlier run in this process holds it"):
            _loop(checkpoint=policy).run()
        first.check()  # still ours
    finally:
        first.release()
    assert read_lease(policy) is None
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    fs, root = policy.filesystem()
    dead = _holder(pid=int(proc.stdout), generation=2)
    fs.pipe_file(f"{root}/{LEASE_DIR}/000000000002.json", dead.to_bytes())
    art = _loop(checkpoint=policy).run()  # the dead holder's lease is taken over
    assert art.steps == 20 and step_dirs(policy) == [10, 20]
    assert read_lease(policy) is None


def test_a_restarted_job_on_the_same_host_waits_for_the_old_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restarted worker group (same scheduler job, same host): the old process is still
    being stopped; the new run waits for it to end, then takes over. One that does not end
    within half the lease time (and still beats) keeps the location."""
    monkeypatch.setenv("PIPEKIT_TRAIN_JOB_ID", "ray-run-7")
    ending = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.0)"])
    _plant(tmp_path / "a", _holder(pid=ending.pid, job="job:ray-run-7"))
    t0 = time.monotonic()
    assert _loop(checkpoint=Checkpoint(tmp_path / "a", every_n_steps=10)).run().steps == 20
    assert time.monotonic() - t0 < 30
    ending.wait()
    staying = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        fresh = _holder(pid=staying.pid, job="job:ray-run-7", heartbeat=time.time())
        _plant(tmp_path / "b", fresh)
        policy = Checkpoint(tmp_path / "b", every_n_steps=10, lease_timeout=3.0)
        with pytest.raises(LeaseError, match=f"pid {staying.pid}"):
            _loop(checkpoint=policy).run()
    finally:
        staying.kill()
        staying.wait()


def test_a_store_without_conditional_creates_is_refused_before_any_work(tmp_path: Path) -> None:
    """fsspec's FTP filesystem cannot create a file only if it is absent: refused when the
    policy is built (no connection is made), fine without a lease."""
    with pytest.raises(ConfigError) as info:
        Checkpoint("ftp://127.0.0.1:1/run", lease_timeout=120)
    message = str(info.value)
    assert "`Checkpoint.lease_timeout` needs a store that creates a file only if" in message
    assert "FTPFileSystem cannot" in message
    assert "Received: directory='ftp://127.0.0.1:1/run', lease_timeout=120" in message
    assert "lease_timeout=None" in message
    assert Checkpoint("ftp://127.0.0.1:1/run", lease_timeout=None).lease_timeout is None


def test_a_store_that_ignores_conditional_creates_is_refused_at_the_probe() -> None:
    """A store that claims conditional writes but lets a second create of one name succeed
    (an S3-compatible server ignoring `If-None-Match`) is refused before the run does
    anything: the lease could not keep two runs apart there."""
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    class Careless(MemoryFileSystem):
        protocol = "careless"

        def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kw: Any) -> None:
            super().pipe_file(path, value, **kw)  # overwrites whatever `mode` says

    fsspec.register_implementation("careless", Careless, clobber=True)
    started: list[int] = []
    loop = _loop(
        checkpoint=Checkpoint(f"careless://{uuid.uuid4().hex}/ck", every_n_steps=5),
        callbacks=[LambdaCallback(on_train_start=lambda state: started.append(1))],
    )
    with pytest.raises(CheckpointError, match=r"accepted two conditional creates of one object"):
        loop.run()
    assert started == []
