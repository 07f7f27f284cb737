"""Checkpoint writes that fail for real: permission denied, a dropped S3 connection.

Each raises one `CheckpointError` naming the step, its location and the latest complete
checkpoint, leaves no partial step, and a rerun resumes exactly. (The disk-full case runs
on every backend in the conformance suite, `test_disk_full_mid_run`.)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipekit_train.core import Checkpoint, CheckpointError, LambdaCallback, TrainingLoop
from pipekit_train.core.checkpoint import step_dirs
from pipekit_train.core.checkpoint._lease import LEASE_DIR
from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp, regression_task

NOBODY = 65534


def _loop(max_steps: int, checkpoint: Checkpoint | None = None, **kw: Any) -> TrainingLoop:
    train, _ = regression_task()
    return TrainingLoop(
        model=NumpyLinearOp("pipekit_train.core.testing:linear", in_size=4, out_size=1),
        data=train,
        loss="mse",
        optimizer_config={"name": "adam", "lr": 0.05},
        batch_size=16,
        max_steps=max_steps,
        seed=0,
        adapter=NumpyAdapter(gradient_noise=0.01),
        checkpoint=checkpoint,
        progress=False,
        **kw,
    )


@contextlib.contextmanager
def _unwritable(folder: Path) -> Iterator[None]:
    """Make `folder` unwritable for this process: mode 0555, and as root also the
    effective user `nobody` (root ignores file modes; every thread follows `seteuid`)."""
    folder.chmod(0o555)
    root = os.geteuid() == 0
    try:
        if root:
            os.seteuid(NOBODY)
        yield
    finally:
        if root:
            os.seteuid(0)
        folder.chmod(0o755)


def test_permission_denied_mid_run() -> None:
    # Outside pytest's private (0700) tmp folder, so that user `nobody` can read it.
    base = Path(tempfile.mkdtemp(prefix="pipekit-perm-"))
    try:
        base.chmod(0o755)
        ck = base / "ck"
        _loop(8, Checkpoint(ck, every_n_steps=4, max_to_keep=None)).run()  # also warms imports
        assert step_dirs(ck) == [4, 8]
        policy = Checkpoint(ck, every_n_steps=4, max_to_keep=None)
        with contextlib.ExitStack() as stack:

            def on_step_end(state: Any) -> None:
                if state.step == 9:  # the location becomes unwritable mid-run
                    stack.enter_context(_unwritable(ck))

            with pytest.raises(CheckpointError) as info:
                # restores step 8, then cannot write step 12
                _loop(16, policy, callbacks=[LambdaCallback(on_step_end=on_step_end)]).run()
        message = str(info.value)
        assert f"step 12 to {ck / '12'}" in message, message
        assert "PermissionError" in message and "Make the location writable" in message
        assert f"latest complete checkpoint is {ck / '8'}" in message
        # nothing partial (the run could not release its lease: the rerun takes it over)
        assert sorted(p.name for p in ck.iterdir() if p.name != LEASE_DIR) == ["4", "8"]
        resumed = _loop(16, policy).run()
        assert resumed.resumed_from_step == 8
        assert resumed.model.serialize_weights() == _loop(16).run().model.serialize_weights()
    finally:
        shutil.rmtree(base, ignore_errors=True)


class _StopServerAt:
    """A callback that stops the S3 server after step `at` (the connection drops), once
    the (possibly background) save of step `committed` is on it."""

    def __init__(self, server: Any, at: int, policy: Checkpoint, committed: int):
        self.server, self.at, self.committed = server, at, committed
        self.fs, self.root = policy.filesystem()

    def on_step_end(self, state: Any) -> None:
        if state.step == self.at:
            marker = f"{self.root}/{self.committed}/MANIFEST.json"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                self.fs.invalidate_cache()
                if self.fs.exists(marker):
                    break
                time.sleep(0.05)
            self.server.stop()


@pytest.mark.slow
@pytest.mark.parametrize("async_save", [True, False], ids=["async", "sync"])
def test_dropped_s3_connection_mid_run(async_save: bool) -> None:
    for module in ("moto.server", "boto3", "s3fs"):
        pytest.importorskip(module)
    from moto.server import ThreadedMotoServer

    from pipekit_train.core.testing import loopback_s3

    bucket = f"pipekit-drop-{uuid.uuid4().hex[:8]}"
    with loopback_s3(bucket) as s3:
        uri = f"s3://{bucket}/run"
        options = {**s3.storage_options, "config_kwargs": {"retries": {"max_attempts": 1}}}
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        dropped = {**options, "client_kwargs": {"endpoint_url": endpoint}}
        policy = Checkpoint(
            uri, every_n_steps=4, max_to_keep=None, async_save=async_save, storage_options=dropped
        )
        with pytest.raises(CheckpointError) as info:
            _loop(40, policy, callbacks=[_StopServerAt(server, 10, policy, 8)]).run()
        message = str(info.value)
        assert f"step 12 to {uri}/12" in message, message
        assert f"latest complete checkpoint is {uri}/8" in message, message
        # The data survives in the first server (moto keeps one in-process backend).
        good = Checkpoint(uri, every_n_steps=4, max_to_keep=None, storage_options=options)
        assert step_dirs(good) == [4, 8]
        resumed = _loop(16, good).run()
        assert resumed.resumed_from_step == 8
        assert resumed.model.serialize_weights() == _loop(16).run().model.serialize_weights()
