"""S3 model registry against a real S3 API server (moto) on loopback, through s3fs."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")
pytest.importorskip("boto3")

from pipekit_train.core._errors import ConfigError, IntegrityError  # noqa: E402
from pipekit_train.core.registry import S3ModelRegistry  # noqa: E402
from pipekit_train.core.registry._claims import exclusive_create  # noqa: E402
from pipekit_train.core.testing import LoopbackS3, loopback_s3  # noqa: E402
from pipekit_train.core.testing._numpy_model import NumpyLinearOp  # noqa: E402

FACTORY = "pipekit_train.core.testing._numpy_model:linear"
BUCKET = "pipekit-registry"


def make_op(seed: int = 0) -> NumpyLinearOp:
    return NumpyLinearOp(FACTORY, seed=seed, in_size=3, out_size=2)


@pytest.fixture(scope="module")
def s3_server() -> Iterator[LoopbackS3]:
    with loopback_s3(BUCKET) as server:
        yield server


@pytest.fixture
def storage_options(s3_server: LoopbackS3) -> dict[str, Any]:
    return s3_server.storage_options


@pytest.fixture
def registry(request: pytest.FixtureRequest, storage_options: dict[str, Any]) -> S3ModelRegistry:
    prefix = request.node.name.replace("[", "-").replace("]", "")
    return S3ModelRegistry(f"s3://{BUCKET}/{prefix}", **storage_options)


def test_s3_round_trip_latest_and_versions(registry: S3ModelRegistry) -> None:
    ops = [make_op(seed=s) for s in range(2)]
    r1 = registry.register("emulator", ops[0], metrics={"val_loss": 0.5})
    r2 = registry.register("emulator", ops[1], metrics={"val_loss": 0.25}, normalizer={"k": 1})
    assert (r1.version, r2.version) == (1, 2)
    assert r2.uri == f"s3://{BUCKET}/test_s3_round_trip_latest_and_versions/emulator/2"
    assert registry.versions("emulator") == [1, 2]
    assert registry.names() == ["emulator"]
    record, op = registry.load_record_and_model("emulator")
    assert record == r2 and record.normalizer == {"k": 1}
    assert hashlib.sha256(op.serialize_weights()).hexdigest() == r2.weights_sha256
    assert op.serialize_weights() == ops[1].serialize_weights()
    x = np.ones((4, 3), dtype=np.float32)
    np.testing.assert_array_equal(registry.load("emulator", 1)(x), ops[0](x))
    keys = sorted(p.rsplit("/", 1)[-1] for p in registry.fs.ls(f"{registry.root}/emulator/1"))
    assert keys == [".claim", "manifest.json", "weights.bin"]


def test_s3_tampered_weights_raise_integrity_error(registry: S3ModelRegistry) -> None:
    record = registry.register("t", make_op(seed=4))
    path = f"{registry.root}/t/1/weights.bin"
    blob = bytearray(registry.fs.cat_file(path))
    blob[20] ^= 0xFF
    registry.fs.pipe_file(path, bytes(blob))
    with pytest.raises(IntegrityError, match=record.weights_sha256):
        registry.load("t")


def test_s3_torn_version_is_invisible_and_missing_errors(registry: S3ModelRegistry) -> None:
    registry.register("m", make_op())
    registry.fs.pipe_file(f"{registry.root}/m/2/.claim", b'{"token": "dead"}')
    assert registry.versions("m") == [1]
    assert registry.register("m", make_op(seed=9)).version == 3
    with pytest.raises(ConfigError, match="no complete version 2"):
        registry.load("m", 2)
    with pytest.raises(ConfigError, match="no model named 'nope'"):
        registry.load("nope")


def test_s3_conditional_put_is_exclusive(registry: S3ModelRegistry) -> None:
    path = f"{registry.root}/marker"
    assert exclusive_create(registry.fs, path, b"first") is True
    assert exclusive_create(registry.fs, path, b"second") is False
    assert registry.fs.cat_file(path) == b"first"


@pytest.mark.slow
def test_s3_concurrent_writers_get_distinct_versions(
    storage_options: dict[str, Any], request: pytest.FixtureRequest
) -> None:
    uri = f"s3://{BUCKET}/{request.node.name}"
    results: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(3)

    def worker(w: int) -> None:
        # one registry (and one s3fs instance, so no shared listing cache) per writer
        reg = S3ModelRegistry(uri, skip_instance_cache=True, **storage_options)
        ops = [make_op(seed=10 * w + i) for i in range(4)]
        barrier.wait()
        for op in ops:
            version = reg.register("shared", op).version
            with lock:
                results.append(version)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == list(range(1, 13))
    reg = S3ModelRegistry(uri, **storage_options)
    assert reg.versions("shared") == list(range(1, 13))
    for v in results:
        reg.load("shared", v)


@pytest.mark.parametrize("uri", ["bucket/prefix", "gs://bucket/x", "s3://", 3])
def test_s3_uri_is_validated(uri: object) -> None:
    with pytest.raises(ConfigError, match="`uri` must be an S3 URL"):
        S3ModelRegistry(uri)  # type: ignore[arg-type]
