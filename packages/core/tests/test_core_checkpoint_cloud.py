"""Checkpoints at a URI: the directory store on S3 (a moto server on loopback) and memory://.

Object stores have no atomic rename: a step is committed by `MANIFEST.json`, written
last, which records the SHA-256 of every other file. A step without it, or with a file
that does not match it, is torn and skipped with a `TornCheckpointWarning`.
"""

from __future__ import annotations

import json
import threading
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

for _module in ("moto.server", "boto3", "s3fs"):
    pytest.importorskip(_module)

from pipekit_train.core import (  # noqa: E402
    Checkpoint,
    ConfigError,
    TornCheckpointWarning,
    TrainingLoop,
)
from pipekit_train.core.adapter import DirectoryCheckpointer  # noqa: E402
from pipekit_train.core.checkpoint import step_dirs  # noqa: E402
from pipekit_train.core.checkpoint._remote import RemoteSteps  # noqa: E402
from pipekit_train.core.testing import (  # noqa: E402
    LoopbackS3,
    NumpyAdapter,
    NumpyLinearOp,
    loopback_s3,
    regression_task,
)

BUCKET = "pipekit-ckpt-core"


@pytest.fixture(scope="module")
def s3() -> Iterator[LoopbackS3]:
    with loopback_s3(BUCKET) as server:
        yield server


@pytest.fixture
def uri() -> str:
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}/ck"


def _store(policy: Checkpoint, **kw: Any) -> DirectoryCheckpointer:
    return DirectoryCheckpointer(
        policy,
        encode=lambda state: {"state.json": json.dumps(state).encode()},
        decode=lambda blobs, template: json.loads(blobs["state.json"]),
        **kw,
    )


def _loop(max_steps: int, checkpoint: Checkpoint | None = None) -> TrainingLoop:
    train, val = regression_task()
    return TrainingLoop(
        model=NumpyLinearOp("pipekit_train.core.testing:linear", in_size=4, out_size=1),
        data=train,
        validation=val,
        loss="mse",
        optimizer_config={"name": "adam", "lr": 0.05},
        batch_size=16,
        max_steps=max_steps,
        seed=0,
        adapter=NumpyAdapter(gradient_noise=0.01),
        checkpoint=checkpoint,
        progress=False,
    )


def test_steps_on_s3_carry_a_manifest_of_every_file(s3: LoopbackS3, uri: str) -> None:
    secret = "pk-secret-9f3e"  # the loopback server takes any credentials
    options = {**s3.storage_options, "secret": secret}
    policy = Checkpoint(uri, every_n_steps=4, max_to_keep=None, storage_options=options)
    art = _loop(8, policy).run()
    assert art.checkpoint_dir == uri
    remote = RemoteSteps(policy)
    assert remote.steps() == step_dirs(policy) == [4, 8]
    for step in (4, 8):
        files = remote.files(step)
        manifest = json.loads(remote.read(step, "MANIFEST.json"))
        assert sorted(manifest["files"]) == [f for f in files if f != "MANIFEST.json"]
        assert {"arrays.bin", "meta.json", "rng.json", "train.json"} == set(manifest["files"])
    # the plan (in the checkpoint and the artifact) names the URI, never the credentials
    meta = remote.read(8, "meta.json").decode()
    assert uri in meta
    assert secret not in meta and secret not in json.dumps(art.plan)
    assert secret not in repr(policy)


@pytest.mark.parametrize("damage", ["marker_missing", "flipped_byte"])
def test_a_torn_step_on_s3_is_skipped(s3: LoopbackS3, uri: str, damage: str) -> None:
    policy = Checkpoint(uri, every_n_steps=4, max_to_keep=None, storage_options=s3.storage_options)
    _loop(8, policy).run()
    remote = RemoteSteps(policy)
    if damage == "marker_missing":  # the upload stopped before the marker was written
        remote.fs.rm_file(remote.path(8, "MANIFEST.json"))
        problem = "no MANIFEST.json"
    else:
        blob = bytearray(remote.read(8, "arrays.bin"))
        blob[len(blob) // 2] ^= 0xFF
        remote.fs.pipe_file(remote.path(8, "arrays.bin"), bytes(blob))
        problem = "arrays.bin does not match its SHA-256"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = _loop(12, policy).run()
    torn = [str(w.message) for w in caught if issubclass(w.category, TornCheckpointWarning)]
    assert len(torn) == 1 and f"{uri}/8" in torn[0] and problem in torn[0], torn
    assert resumed.resumed_from_step == 4
    assert resumed.model.serialize_weights() == _loop(12).run().model.serialize_weights()
    assert step_dirs(policy) == [4, 8, 12]  # step 8 written again, from the right timeline
    assert json.loads(remote.read(8, "MANIFEST.json"))["step"] == 8


def test_retention_deletes_old_steps_on_s3(s3: LoopbackS3, uri: str) -> None:
    policy = Checkpoint(
        uri,
        max_to_keep=2,
        keep_best=1,
        monitor="val_loss",
        async_save=False,
        storage_options=s3.storage_options,
    )
    store = _store(policy)
    for step, score in {1: 0.5, 2: 0.1, 3: 0.4, 4: 0.3, 5: 0.6}.items():
        store.save(step, {"w": step}, {"step": step}, {"val_loss": score})
    remote = RemoteSteps(policy)
    assert remote.steps() == [2, 4, 5]
    prefix = remote.root + "/"
    keys = {p[len(prefix) :].split("/", 1)[0] for p in remote.fs.find(remote.root)}
    assert keys == {"2", "4", "5"}  # nothing of the deleted steps is left
    # a new checkpointer reads the scores back from the markers and keeps the best
    store = _store(policy)
    store.save(6, {"w": 6}, {"step": 6}, {"val_loss": 0.9})
    assert remote.steps() == [2, 5, 6]
    assert _store(policy).restore_latest(None).state == {"w": 6}


def test_async_saves_to_s3_return_before_the_upload(s3: LoopbackS3, uri: str) -> None:
    policy = Checkpoint(uri, async_save=True, storage_options=s3.storage_options)
    release = threading.Event()
    threads: list[str] = []

    def encode(snapshot: dict[str, Any]) -> dict[str, bytes]:
        threads.append(threading.current_thread().name)
        assert release.wait(30)
        return {"state.json": json.dumps(snapshot).encode()}

    state = {"w": [1.0, 2.0]}
    store = DirectoryCheckpointer(
        policy,
        snapshot=lambda s: json.loads(json.dumps(s)),  # a copy the next step cannot change
        encode=encode,
        decode=lambda blobs, template: json.loads(blobs["state.json"]),
    )
    assert store.save(3, state, {"step": 3}, {}) == f"{uri}/3"
    state["w"][0] = 99.0  # the training thread moves on while the writer is still busy
    remote = RemoteSteps(policy)
    assert remote.steps() == []  # nothing is committed yet: save() did not wait
    release.set()
    store.close()
    assert threads and threads[0].startswith("pipekit-ckpt")
    assert remote.steps() == [3]
    assert _store(policy).restore_latest(None).state == {"w": [1.0, 2.0]}


def test_memory_uri_in_process() -> None:
    uri = f"memory://pipekit-core/{uuid.uuid4().hex}"
    policy = Checkpoint(uri, every_n_steps=3, max_to_keep=1)
    fs, root = policy.filesystem()
    try:
        first = _loop(6, policy).run()
        assert step_dirs(policy) == [6] and first.checkpoint_dir == uri
        resumed = _loop(9, policy).run()
        assert resumed.resumed_from_step == 6
        assert resumed.model.serialize_weights() == _loop(9).run().model.serialize_weights()
        assert step_dirs(policy) == [9]
        with pytest.raises(ConfigError, match="already holds checkpoints"):
            _loop(9, Checkpoint(uri, resume="never"))
    finally:
        fs.rm(root, recursive=True)


def test_an_existing_file_at_the_uri_is_refused_before_any_work() -> None:
    uri = f"memory://pipekit-core/{uuid.uuid4().hex}"
    policy = Checkpoint(uri)
    fs, root = policy.filesystem()
    fs.pipe_file(root, b"not a folder")
    try:
        with pytest.raises(ConfigError, match="existing file") as info:
            _loop(4, policy).run()
        assert f"Received: directory={uri!r}" in str(info.value)
        assert fs.cat_file(root) == b"not a folder"
    finally:
        fs.rm(root)
