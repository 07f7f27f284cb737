"""CachedDataset.build on Ray: one local Ray runtime for this module, local and S3 stores.

The S3 store is a real S3 API server (moto) on loopback, reached through s3fs from the
driver and from the Ray workers alike.
"""

from __future__ import annotations

import os
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

from pipekit_train.core._errors import ConfigError  # noqa: E402
from pipekit_train.core.data import (  # noqa: E402
    ArrayDataset,
    CachedDataset,
    RayBuildExecutor,
    SimulationDataset,
)
from pipekit_train.core.data.cache._ray_build import RaySession  # noqa: E402

BUCKET = "pipekit-cache"
CREDS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
# Environment of the Ray processes (see packages/sweep/tests/test_sweep_ray.py): no
# `uv run` per worker, and bytecode written so Ray starts within its time limits. Ray reads
# RAY_ENABLE_UV_RUN_RUNTIME_ENV when it is imported, so the fixture also sets the constant
# (else `ray.init` under `uv run` packages the whole worktree and starts every worker
# through `uv run`: tens of seconds on a loaded 2-core machine).
RAY_ENV = {
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
    "PYTHONDONTWRITEBYTECODE": "",
}


# -- sources (pickled by value into the Ray workers: see the `ray_runtime` fixture) -------
def prior(rng: np.random.Generator) -> np.ndarray:
    return rng.normal(size=3)


def simulator(theta: np.ndarray) -> np.ndarray:
    if theta[0] > 1.2:
        return np.array([np.inf, 0.0])
    return np.array([np.tanh(theta).sum(), np.cos(theta[1])], dtype=np.float32)


class LoggedDataset(ArrayDataset):
    """An ArrayDataset that leaves a file per computed block in `log_dir`, and whose worker
    process dies (`os._exit`) the first time it computes row `die_at`."""

    log_dir: str
    die_at: int | None = None

    def get_batch(self, indices: np.ndarray) -> dict:
        idx = np.asarray(indices)
        log = Path(self.log_dir)
        (log / f"{int(idx[0])}-{uuid.uuid4().hex}").touch()
        if self.die_at is not None and self.die_at in idx and not (log / "died").exists():
            (log / "died").touch()
            os._exit(1)
        return super().get_batch(indices)


def logged(log_dir: Path, die_at: int | None = None, n: int = 100) -> LoggedDataset:
    rng = np.random.default_rng(0)
    ds = LoggedDataset(x=rng.normal(size=(n, 3)).astype(np.float32), y=np.arange(n)[:, None])
    log_dir.mkdir(parents=True, exist_ok=True)
    ds.log_dir, ds.die_at = str(log_dir), die_at
    return ds


def computed_starts(log_dir: Path) -> list[int]:
    """The first row of every block computed, from the log files (sorted)."""
    return sorted(int(p.name.split("-")[0]) for p in log_dir.iterdir() if p.name != "died")


# -- fixtures ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with pytest.MonkeyPatch.context() as mp:
        for k, v in CREDS.items():
            mp.setenv(k, v)
        for k in (
            "AWS_PROFILE",
            "AWS_SESSION_TOKEN",
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "http_proxy",
            "https_proxy",
        ):
            mp.delenv(k, raising=False)
        mp.setenv("NO_PROXY", "127.0.0.1,localhost")
        server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        try:
            host, port = server.get_host_and_port()
            endpoint = f"http://{host}:{port}"
            boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
                Bucket=BUCKET
            )
            yield endpoint
        finally:
            server.stop()


@pytest.fixture(scope="module")
def ray_runtime(s3_endpoint: str) -> Iterator[None]:
    """One local Ray runtime (2 CPUs, 2 `builder` resources) started after the S3
    environment is set, so the workers inherit it."""
    module = sys.modules[__name__]
    ray.cloudpickle.register_pickle_by_value(module)  # workers cannot import this module
    with pytest.MonkeyPatch.context() as mp:
        for key, value in RAY_ENV.items():
            mp.setenv(key, value)
        mp.setattr(ray._private.ray_constants, "RAY_ENABLE_UV_RUN_RUNTIME_ENV", False)
        ray.init(
            address="local",  # a new runtime, never a cluster another process started
            num_cpus=2,
            resources={"builder": 2},
            include_dashboard=False,
            log_to_driver=False,
        )
    try:
        yield
    finally:
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(module)


@pytest.fixture
def storage_options(s3_endpoint: str) -> dict[str, Any]:
    return {
        "key": CREDS["AWS_ACCESS_KEY_ID"],
        "secret": CREDS["AWS_SECRET_ACCESS_KEY"],
        "client_kwargs": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"},
    }


def _s3_fs(storage_options: dict[str, Any]) -> Any:
    import s3fs

    return s3fs.S3FileSystem(**storage_options, skip_instance_cache=True)


def store_files(where: str, root: str | Path, storage_options: dict[str, Any]) -> dict:
    """Every file of a store, `{relative path: bytes}` (chunks, metadata, done marks)."""
    if where == "local":
        base = Path(root)
        return {str(p.relative_to(base)): p.read_bytes() for p in base.rglob("*") if p.is_file()}
    fs, prefix = _s3_fs(storage_options), str(root).removeprefix("s3://")
    return {p[len(prefix) + 1 :]: fs.cat_file(p) for p in fs.find(prefix)}


def _assert_same(a: CachedDataset, b: CachedDataset) -> None:
    assert len(a) == len(b)
    idx = np.arange(len(a))
    ba, bb = a.get_batch(idx), b.get_batch(idx)
    assert sorted(ba) == sorted(bb)
    for key in ba:
        assert ba[key].dtype == bb[key].dtype and ba[key].tobytes() == bb[key].tobytes()


def _uri(where: str, tmp_path: Path, name: str) -> str:
    if where == "local":
        return str(tmp_path / name)
    return f"s3://{BUCKET}/{tmp_path.name}/{name}"


# -- tests ---------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.slow
def test_ray_build_writes_the_same_bytes_as_a_serial_build(
    ray_runtime: None, tmp_path: Path, storage_options: dict[str, Any], where: str
) -> None:
    serial_ds = SimulationDataset(simulator, prior, 90, seed=2, on_invalid="drop")
    serial = CachedDataset.build(serial_ds, tmp_path / "serial.zarr", chunk_size=16)
    ray_ds = SimulationDataset(simulator, prior, 90, seed=2, on_invalid="drop")
    uri = _uri(where, tmp_path, "ray.zarr")
    options = storage_options if where == "s3" else None
    progress: list[tuple[int, int]] = []
    built = CachedDataset.build(
        ray_ds,
        uri,
        chunk_size=16,
        executor="ray",
        storage_options=options,
        progress=lambda done, total: progress.append((done, total)),
    )
    assert ray_ds.valid_indices is not None  # scanned (as Ray tasks) before the build
    assert len(built) == len(serial) < 90 and built.meta["num_chunks"] == 5
    assert ray_ds.stats == serial_ds.stats  # the workers' counters are merged back
    assert progress == [(d, 5) for d in range(1, 6)]
    _assert_same(built, serial)
    assert built.fingerprint() == serial.fingerprint()
    out_of_core = CachedDataset(uri, storage_options=options, memory_budget_bytes=0)
    assert out_of_core._files is not None  # chunk files read straight from the store
    _assert_same(out_of_core, serial)
    # byte for byte the same store: every chunk, the done marks and the metadata
    serial_files = store_files("local", tmp_path / "serial.zarr", {})
    ray_files = store_files(where, uri, storage_options)
    assert sorted(ray_files) == sorted(serial_files)
    assert any(name.startswith("x/c/") for name in ray_files)
    assert ray_files == serial_files
    assert ray.is_initialized()  # a runtime the build did not start stays up


@pytest.mark.slow
def test_ray_build_resumes_after_a_killed_worker(
    ray_runtime: None, tmp_path: Path, storage_options: dict[str, Any]
) -> None:
    serial = CachedDataset.build(
        logged(tmp_path / "serial-log"), tmp_path / "s.zarr", chunk_size=10
    )
    uri = _uri("s3", tmp_path, "c.zarr")
    executor = RayBuildExecutor(max_retries=0, max_in_flight=2, resources={"builder": 1})
    first_log = tmp_path / "log-1"
    with pytest.raises(ray.exceptions.WorkerCrashedError):
        CachedDataset.build(
            logged(first_log, die_at=95),  # chunk 9 of 10 kills its worker
            uri,
            chunk_size=10,
            executor=executor,
            storage_options=storage_options,
        )
    with pytest.raises(ConfigError, match="incomplete cache"):
        CachedDataset(uri, storage_options=storage_options)
    import zarr

    group = zarr.open_group(
        zarr.storage.FsspecStore.from_url(uri, storage_options=storage_options), mode="r"
    )
    done = np.asarray(group["_pipekit_done"][:])
    missing = np.flatnonzero(~done).tolist()
    assert 9 in missing and done.sum() >= 1
    assert set(np.flatnonzero(done) * 10) <= set(computed_starts(first_log))

    second_log = tmp_path / "log-2"
    resumed_ds = logged(second_log, die_at=95)
    (second_log / "died").touch()  # it died once already
    resumed = CachedDataset.build(
        resumed_ds, uri, chunk_size=10, executor=executor, storage_options=storage_options
    )
    # only the missing chunks were computed, each once; the written ones were kept
    assert computed_starts(second_log) == [10 * c for c in missing]
    _assert_same(resumed, serial)
    chunks = {k: v for k, v in store_files("s3", uri, storage_options).items() if "/c/" in k}
    serial_chunks = store_files("local", tmp_path / "s.zarr", {})
    assert chunks == {k: v for k, v in serial_chunks.items() if "/c/" in k}


@pytest.mark.slow  # the module's Ray runtime takes >10 s to start
def test_ray_retries_a_chunk_whose_worker_died(ray_runtime: None, tmp_path: Path) -> None:
    log = tmp_path / "log"
    built = CachedDataset.build(
        logged(log, die_at=42), tmp_path / "c.zarr", chunk_size=10, executor=RayBuildExecutor()
    )
    starts = computed_starts(log)
    assert starts.count(40) == 2  # the chunk whose worker died ran again (max_retries=3)
    assert sorted(set(starts)) == list(range(0, 100, 10)) and len(starts) == 11
    serial = CachedDataset.build(
        logged(tmp_path / "serial-log"), tmp_path / "s.zarr", chunk_size=10
    )
    _assert_same(built, serial)


@pytest.mark.slow  # the module's Ray runtime takes >10 s to start
def test_ray_build_refuses_a_dataset_ray_cannot_send(ray_runtime: None, tmp_path: Path) -> None:
    ds = ArrayDataset(x=np.zeros((10, 2), np.float32))
    ds.lock = threading.Lock()  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="Ray must be able to serialize it"):
        CachedDataset.build(ds, tmp_path / "c.zarr", executor="ray")
    assert not (tmp_path / "c.zarr").exists()
    assert ray.is_initialized()
    # a resource no node has: warned before any task is submitted (an autoscaler may add it)
    unmet = RayBuildExecutor(num_gpus=0.5, resources={"builder": 1, "tpu": 2})
    with pytest.warns(RuntimeWarning, match=r"requests \{'GPU': 0.5, 'tpu': 2.0\}"):
        RaySession(ray, unmet, ArrayDataset(x=np.zeros((10, 2), np.float32)))
