"""Local model registry: round trip, integrity, versions, names, errors, concurrent writers."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from pipekit_train.core._errors import ConfigError, IntegrityError
from pipekit_train.core.registry import (
    FsspecModelRegistry,
    LocalModelRegistry,
    ModelRecord,
    ModelRegistry,
    _registry,
)
from pipekit_train.core.registry._claims import exclusive_create
from pipekit_train.core.testing._numpy_model import NumpyLinearOp

FACTORY = "pipekit_train.core.testing._numpy_model:linear"


def make_op(seed: int = 0, in_size: int = 3, out_size: int = 2) -> NumpyLinearOp:
    return NumpyLinearOp(FACTORY, seed=seed, in_size=in_size, out_size=out_size)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def registry(tmp_path: Path) -> LocalModelRegistry:
    return LocalModelRegistry(tmp_path / "models")


def test_round_trip_is_byte_identical_and_predicts_the_same(registry: LocalModelRegistry) -> None:
    op = make_op(seed=7)
    op.model.b[:] = [0.5, -0.25]  # not the factory's init, so a fresh rebuild would differ
    before = op.serialize_weights()
    record = registry.register("emulator", op, metrics={"val_loss": np.float32(0.125)})

    assert isinstance(registry, ModelRegistry)
    assert record.version == 1 and record.name == "emulator"
    assert record.weights_sha256 == sha(before)
    assert record.metrics == {"val_loss": 0.125}
    assert record.config == op.get_config()
    assert (
        record.lineage["backend"] == "numpy" and "pipekit-train-core" in record.lineage["versions"]
    )
    assert record.uri.startswith("file://") and record.uri.endswith("/emulator/1")

    loaded = registry.load("emulator")
    assert isinstance(loaded, NumpyLinearOp)
    assert sha(loaded.serialize_weights()) == sha(before)
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_array_equal(loaded(x), op(x))

    root = Path(registry.root)
    files = sorted(p.name for p in (root / "emulator" / "1").iterdir())
    assert files == [".claim", "manifest.json", "weights.bin"]
    manifest = json.loads((root / "emulator" / "1" / "manifest.json").read_text())
    assert manifest["config"]["factory"] == FACTORY and manifest["weights_sha256"] == sha(before)
    assert (root / "emulator" / "1" / "weights.bin").read_bytes() == before


def test_versions_latest_record_and_load_record_and_model(registry: LocalModelRegistry) -> None:
    ops = [make_op(seed=s) for s in range(3)]
    records = [
        registry.register(
            "m", op, metrics={"i": i}, lineage={"sweep_id": "sw1", "plan": {"seed": i}}
        )
        for i, op in enumerate(ops)
    ]
    assert [r.version for r in records] == [1, 2, 3]
    assert registry.versions("m") == [1, 2, 3]
    assert registry.record("m") == records[2]
    assert registry.record("m", 2) == records[1]
    assert registry.record("m", 2).lineage["sweep_id"] == "sw1"

    record, op = registry.load_record_and_model("m", version=1)
    assert record == records[0]
    assert op.serialize_weights() == ops[0].serialize_weights()
    assert registry.load("m").serialize_weights() == ops[2].serialize_weights()

    again = ModelRecord.from_json(json.dumps(record.to_json()))
    assert again == record
    assert ModelRecord.from_json(record.to_json()) == record


def test_names_lists_only_complete_models(registry: LocalModelRegistry) -> None:
    assert registry.names() == []
    registry.register("b-model", make_op())
    registry.register("a.model_2", make_op())
    os.makedirs(os.path.join(registry.root, "torn", "1"))
    assert registry.names() == ["a.model_2", "b-model"]


def test_normalizer_json_is_stored(registry: LocalModelRegistry) -> None:
    class Norm:
        def to_json(self) -> dict:
            return {"x": {"mean": np.array([1.0, 2.0]), "std": [1.0, 1.0]}}

    registry.register("n", make_op(), normalizer=Norm())
    assert registry.record("n").normalizer == {"x": {"mean": [1.0, 2.0], "std": [1.0, 1.0]}}
    registry.register("n", make_op(), normalizer={"kind": "identity"})
    assert registry.record("n").normalizer == {"kind": "identity"}
    assert registry.record("n", 1).normalizer is not None


def test_non_finite_metrics_are_stored_as_strict_json(registry: LocalModelRegistry) -> None:
    record = registry.register(
        "nan", make_op(), metrics={"loss": float("nan"), "best": float("inf")}
    )
    assert record.metrics == {"loss": "nan", "best": "inf"}
    text = (Path(registry.root) / "nan" / "1" / "manifest.json").read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))


def test_tampered_weights_raise_integrity_error(registry: LocalModelRegistry) -> None:
    record = registry.register("t", make_op(seed=3))
    path = Path(registry.root) / "t" / "1" / "weights.bin"
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 0x01
    path.write_bytes(bytes(blob))
    with pytest.raises(IntegrityError) as info:
        registry.load("t")
    msg = str(info.value)
    assert "'t'" in msg and "version 1" in msg
    assert record.weights_sha256 in msg and sha(bytes(blob)) in msg


def test_missing_weights_raise_integrity_error(registry: LocalModelRegistry) -> None:
    registry.register("w", make_op())
    (Path(registry.root) / "w" / "1" / "weights.bin").unlink()
    with pytest.raises(IntegrityError, match="no weights"):
        registry.load("w", 1)


def test_torn_registrations_are_invisible_and_not_reused(registry: LocalModelRegistry) -> None:
    registry.register("torn", make_op(seed=1))
    # a writer that died after claiming version 2 and writing the weights
    (Path(registry.root) / "torn" / "2").mkdir()
    (Path(registry.root) / "torn" / "2" / ".claim").write_text('{"token": "dead"}')
    (Path(registry.root) / "torn" / "2" / "weights.bin").write_bytes(b"partial")
    # and one whose manifest is cut short
    (Path(registry.root) / "torn" / "3").mkdir()
    (Path(registry.root) / "torn" / "3" / "manifest.json").write_text('{"format": "pipekit-tr')
    assert registry.versions("torn") == [1]
    assert registry.record("torn").version == 1
    with pytest.raises(ConfigError, match=r"no complete version 2.*Available versions: \[1\]"):
        registry.load("torn", 2)
    record = registry.register("torn", make_op(seed=2))
    assert record.version == 4
    assert registry.versions("torn") == [1, 4]


@pytest.mark.parametrize("name", ["", ".", "..", ".hidden", "a/b", "a b", "x" * 129, "ü", None, 3])
def test_bad_names_are_rejected_before_writing(registry: LocalModelRegistry, name: object) -> None:
    with pytest.raises(ConfigError, match="`name` must be"):
        registry.register(name, make_op())  # type: ignore[arg-type]
    assert os.listdir(registry.root) == []


@pytest.mark.parametrize("version", [0, -1, True, "1", "newest", 1.0])
def test_bad_versions_are_rejected(registry: LocalModelRegistry, version: object) -> None:
    registry.register("m", make_op())
    with pytest.raises(ConfigError, match="`version` must be"):
        registry.load("m", version)  # type: ignore[arg-type]


def test_missing_name_and_version_errors(registry: LocalModelRegistry) -> None:
    registry.register("present", make_op())
    with pytest.raises(ConfigError, match=r"no model named 'absent'.*\['present'\]"):
        registry.load("absent")
    with pytest.raises(ConfigError, match="no model named 'absent'"):
        registry.record("absent", 2)
    with pytest.raises(ConfigError, match=r"no complete version 5.*\[1\]"):
        registry.load("present", 5)
    assert registry.versions("absent") == []


def test_bad_model_and_metadata_are_rejected_before_writing(registry: LocalModelRegistry) -> None:
    with pytest.raises(ConfigError, match="`model_op` must be a model operator"):
        registry.register("m", object())
    with pytest.raises(ConfigError, match="`metrics` must be JSON-serialisable"):
        registry.register("m", make_op(), metrics={"f": object()})
    with pytest.raises(ConfigError, match="`normalizer` must be a JSON object"):
        registry.register("m", make_op(), normalizer=[1, 2])
    assert os.listdir(registry.root) == []


def test_registry_constructors_validate(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="`root` must be a local folder"):
        LocalModelRegistry("s3://bucket/x")
    reg = FsspecModelRegistry(f"file://{tmp_path}/viafsspec")
    reg.register("m", make_op())
    assert LocalModelRegistry(tmp_path / "viafsspec").versions("m") == [1]


def test_exclusive_create_is_exclusive_locally(tmp_path: Path) -> None:
    from fsspec.implementations.local import LocalFileSystem

    fs = LocalFileSystem()
    path = f"{tmp_path}/d/marker"
    assert exclusive_create(fs, path, b"first") is True
    assert exclusive_create(fs, path, b"second") is False
    assert Path(path).read_bytes() == b"first"


def test_lost_claim_race_moves_on_to_the_next_version(
    registry: LocalModelRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = _registry.exclusive_create
    raced: list[str] = []

    def rival_gets_there_first(fs: object, path: str, data: bytes) -> bool:
        if path.endswith("/.claim") and not raced:
            raced.append(path)
            assert real(fs, path, b'{"token": "rival"}')
        return real(fs, path, data)

    monkeypatch.setattr(_registry, "exclusive_create", rival_gets_there_first)
    record = registry.register("r", make_op())
    assert raced and raced[0].endswith("/r/1/.claim")
    assert record.version == 2
    assert registry.versions("r") == [2]  # the rival never committed version 1


def test_stale_listing_still_yields_distinct_versions(
    registry: LocalModelRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(FsspecModelRegistry, "_claimed_versions", lambda self, name: [])
    got = [registry.register("stale", make_op(seed=s)).version for s in range(3)]
    assert got == [1, 2, 3]


def test_concurrent_threads_get_distinct_versions(registry: LocalModelRegistry) -> None:
    results: list[tuple[int, str]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(4)

    def worker(w: int) -> None:
        ops = [make_op(seed=100 * w + i) for i in range(5)]
        barrier.wait()
        for op in ops:
            rec = registry.register("threads", op)
            with lock:
                results.append((rec.version, rec.weights_sha256))

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(v for v, _ in results) == list(range(1, 21))
    assert registry.versions("threads") == list(range(1, 21))
    for version, digest in results:
        assert sha(registry.load("threads", version).serialize_weights()) == digest


_WORKER = textwrap.dedent(
    """
    import os, sys, time
    from pipekit_train.core.registry import LocalModelRegistry
    from pipekit_train.core.testing._numpy_model import NumpyLinearOp

    root, go, wid, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    registry = LocalModelRegistry(root)
    ops = [NumpyLinearOp("pipekit_train.core.testing._numpy_model:linear",
                         seed=1000 * wid + i, in_size=3, out_size=2) for i in range(n)]
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            sys.exit("never told to go")
        time.sleep(0.001)
    for i, op in enumerate(ops):
        rec = registry.register("shared", op, metrics={"worker": wid, "i": i})
        print(rec.version, rec.weights_sha256, wid, i, flush=True)
    """
)


def test_concurrent_processes_get_distinct_versions_and_lose_nothing(tmp_path: Path) -> None:
    root = tmp_path / "models"
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(root), str(go), str(w), "10"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(2)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            assert line.strip() == "ready", (line, p.stderr.read() if p.stderr else "")
        go.write_text("go")
        outputs = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            outputs.extend(line.split() for line in out.splitlines())
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    versions = sorted(int(o[0]) for o in outputs)
    assert versions == list(range(1, 21))
    registry = LocalModelRegistry(root)
    assert registry.versions("shared") == list(range(1, 21))
    for version, digest, wid, i in outputs:
        record, op = registry.load_record_and_model("shared", int(version))
        assert record.weights_sha256 == digest == sha(op.serialize_weights())
        assert record.metrics == {"worker": int(wid), "i": int(i)}
        expected = make_op(seed=1000 * int(wid) + int(i)).serialize_weights()
        assert op.serialize_weights() == expected


def test_registry_import_does_not_touch_backends() -> None:
    code = (
        "import sys; import pipekit_train.core.registry, pipekit_train.core.rollout._cycle; "
        "print([m for m in ('jax', 'torch', 'keras', 'equinox', 'lightning', 'tensorflow') "
        "if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out


def test_any_fsspec_filesystem_works() -> None:
    import uuid

    registry = FsspecModelRegistry(f"memory://registry-{uuid.uuid4().hex}")
    op = make_op(seed=2)
    assert [registry.register("mem", op).version for _ in range(2)] == [1, 2]
    assert registry.names() == ["mem"]
    assert registry.load("mem").serialize_weights() == op.serialize_weights()
