"""Orbax checkpoints at a URI: S3 on a loopback moto server, and memory://.

Orbax writes each step into a local staging folder; the step is sealed there and
uploaded with `pipekit-digest.json` last, as its commit marker. A step without the
marker, or with a file that does not match it, is torn: skipped with a
`TornCheckpointWarning`, and the run continues byte-identical from the previous step.
"""

from __future__ import annotations

import json
import tempfile
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

for _module in ("moto.server", "boto3", "s3fs"):
    pytest.importorskip(_module)

from pipekit_train.core import Checkpoint, TornCheckpointWarning, TrainingLoop  # noqa: E402
from pipekit_train.core.checkpoint import step_dirs  # noqa: E402
from pipekit_train.core.checkpoint._digest import FOLDER_DIGEST  # noqa: E402
from pipekit_train.core.checkpoint._lease import LEASE_DIR  # noqa: E402
from pipekit_train.core.checkpoint._remote import RemoteSteps  # noqa: E402
from pipekit_train.core.testing import LoopbackS3, loopback_s3  # noqa: E402
from pipekit_train.equinox import EquinoxModelOp  # noqa: E402

BUCKET = "pipekit-ckpt-equinox"


@pytest.fixture(scope="module")
def s3() -> Iterator[LoopbackS3]:
    with loopback_s3(BUCKET) as server:
        yield server


@pytest.fixture(scope="module")
def build(regression: tuple[Any, Any]) -> Callable[..., TrainingLoop]:
    train, val = regression

    def make(max_steps: int, checkpoint: Checkpoint | None = None) -> TrainingLoop:
        return TrainingLoop(
            model=EquinoxModelOp(
                "pipekit_train.equinox.testing:linear", in_size=4, out_size=1, seed=0
            ),
            data=train,
            validation=val,
            loss="mse",
            optimizer_config={"name": "adam", "lr": 0.02},
            batch_size=16,
            max_steps=max_steps,
            seed=0,
            validate_every_n_steps=2,
            progress=False,
            checkpoint=checkpoint,
        )

    return make


def _staging_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("pipekit-ckpt-staging-*")}


@pytest.fixture(scope="module")
def saved(build: Callable[..., TrainingLoop], s3: LoopbackS3) -> str:
    """Steps 4 and 8 of a run on S3 (the URI)."""
    uri = f"s3://{BUCKET}/saved"
    before = _staging_dirs()
    art = build(
        8, Checkpoint(uri, every_n_steps=4, max_to_keep=None, storage_options=s3.storage_options)
    ).run()
    assert art.checkpoint_dir == uri
    assert _staging_dirs() <= before  # the staging folder is gone after the run
    return uri


@pytest.fixture(scope="module")
def reference(build: Callable[..., TrainingLoop]) -> bytes:
    return build(12).run().model.serialize_weights()


def _copy_of(saved: str, s3: LoopbackS3) -> Checkpoint:
    uri = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"
    source = RemoteSteps(Checkpoint(saved, storage_options=s3.storage_options))
    source.fs.copy(source.root, uri[len("s3://") :], recursive=True)
    return Checkpoint(uri, every_n_steps=4, max_to_keep=None, storage_options=s3.storage_options)


def test_steps_on_s3_are_sealed_with_the_marker(saved: str, s3: LoopbackS3) -> None:
    remote = RemoteSteps(Checkpoint(saved, storage_options=s3.storage_options))
    assert remote.steps() == [4, 8]
    for step in (4, 8):
        files = remote.files(step)
        record = json.loads(remote.read(step, FOLDER_DIGEST))
        assert record["step"] == step
        assert sorted(record["files"]) == [f for f in files if f != FOLDER_DIGEST]
        assert {"pipekit/metadata", "meta/metadata", "state/manifest.ocdbt"} <= set(files)


@pytest.mark.parametrize("damage", ["marker_missing", "flipped_byte"])
def test_a_torn_step_on_s3_is_skipped(
    build: Callable[..., TrainingLoop],
    saved: str,
    s3: LoopbackS3,
    reference: bytes,
    damage: str,
) -> None:
    policy = _copy_of(saved, s3)
    remote = RemoteSteps(policy)
    if damage == "marker_missing":  # the upload stopped before the marker went up
        remote.fs.rm_file(remote.path(8, FOLDER_DIGEST))
        problem = f"no {FOLDER_DIGEST}"
    else:
        name = next(f for f in remote.files(8) if f.startswith("state/d/"))
        blob = bytearray(remote.read(8, name))
        blob[len(blob) // 2] ^= 0xFF
        remote.fs.pipe_file(remote.path(8, name), bytes(blob))
        problem = f"{name} does not match its SHA-256 digest"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = build(12, policy).run()
    torn = [str(w.message) for w in caught if issubclass(w.category, TornCheckpointWarning)]
    assert len(torn) == 1 and f"{policy.location}/8" in torn[0] and problem in torn[0], torn
    assert resumed.resumed_from_step == 4
    assert resumed.model.serialize_weights() == reference
    assert step_dirs(policy) == [4, 8, 12]  # step 8 written again, from the right timeline
    assert json.loads(remote.read(8, FOLDER_DIGEST))["step"] == 8
    remote.fs.rm(remote.root, recursive=True)


def test_retention_on_s3_keeps_latest_and_best(
    build: Callable[..., TrainingLoop], s3: LoopbackS3
) -> None:
    uri = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"
    # mode="max" keeps the *worst* validation loss: an early one, while the loss falls
    policy = Checkpoint(
        uri,
        every_n_steps=2,
        max_to_keep=1,
        keep_best=1,
        mode="max",
        async_save=True,
        storage_options=s3.storage_options,
    )
    art = build(8, policy).run()
    val_steps, val = art.history.series("val_loss")
    worst = val_steps[max(range(len(val)), key=lambda i: val[i])]
    remote = RemoteSteps(policy)
    assert remote.steps() == sorted({worst, 8})
    kept = {p[len(remote.root) + 1 :].split("/", 1)[0] for p in remote.fs.find(remote.root)}
    assert kept == {str(s) for s in sorted({worst, 8})} | {LEASE_DIR}  # and the lease's record
    remote.fs.rm(remote.root, recursive=True)
