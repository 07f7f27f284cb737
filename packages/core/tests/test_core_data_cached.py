"""CachedDataset: build (local and memory://), resume, staleness, reading modes, workers."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.data import (
    ArrayDataset,
    CachedDataset,
    RayBuildExecutor,
    SimulationDataset,
    make_batches,
    split,
)


def _dataset(n: int = 100, offset: float = 0.0) -> ArrayDataset:
    rng = np.random.default_rng(0)
    return ArrayDataset(
        x=rng.normal(size=(n, 3)).astype(np.float32) + offset,
        y=np.arange(n, dtype=np.int64)[:, None],
        mask=(np.arange(n) % 3 == 0),
    )


def _memory_uri() -> str:
    return f"memory://pipekit-tests/{uuid.uuid4().hex}/cache.zarr"


def _assert_same(a: object, b: object, n: int) -> None:
    idx = np.arange(n)
    ba, bb = a.get_batch(idx), b.get_batch(idx)  # type: ignore[attr-defined]
    assert sorted(ba) == sorted(bb)
    for key in ba:
        assert ba[key].dtype == bb[key].dtype
        assert ba[key].tobytes() == bb[key].tobytes()


class FailingDataset(ArrayDataset):
    """An ArrayDataset (same fingerprint) that raises when asked for row `fail_at`."""

    fail_at: int | None = None
    requested: list[int]

    def get_batch(self, indices: np.ndarray) -> dict:
        self.requested.extend(np.asarray(indices).tolist())
        if self.fail_at is not None and self.fail_at in np.asarray(indices):
            raise RuntimeError(f"source died at item {self.fail_at}")
        return super().get_batch(indices)


@pytest.mark.parametrize("where", ["local", "memory"])
def test_build_round_trip_and_reopen(tmp_path: Path, where: str) -> None:
    ds = _dataset(100)
    uri = str(tmp_path / "c.zarr") if where == "local" else _memory_uri()
    cache = CachedDataset.build(ds, uri, chunk_size=16)
    assert len(cache) == 100 and cache.chunk_size == 16 and cache.in_memory
    assert cache.keys == ("x", "y", "mask") and cache.element_spec == ds.element_spec
    assert cache.fingerprint() == ds.fingerprint()
    assert cache.meta["complete"] and cache.meta["num_chunks"] == 7
    _assert_same(cache, ds, 100)
    np.testing.assert_array_equal(cache[42]["x"], ds[42]["x"])
    reopened = CachedDataset(uri, memory_budget_bytes=0)  # out-of-core reading
    assert not reopened.in_memory and reopened.shuffle_window == 16
    _assert_same(reopened, ds, 100)
    order = np.random.default_rng(0).permutation(100)
    for key, value in reopened.get_batch(order).items():
        np.testing.assert_array_equal(value, ds.get_batch(order)[key])
    again = CachedDataset.build(ds, uri, chunk_size=16)  # complete: returned as is
    _assert_same(again, ds, 100)


def test_auto_chunk_size_and_file_uri(tmp_path: Path) -> None:
    ds = _dataset(50)
    cache = CachedDataset.build(ds, f"file://{tmp_path}/c.zarr")
    assert cache.chunk_size == 50  # ~1 MiB per chunk, capped at n
    _assert_same(cache, ds, 50)


def test_resumable_build_skips_written_chunks(tmp_path: Path) -> None:
    uri = str(tmp_path / "c.zarr")
    base = _dataset(100)
    failing = FailingDataset(**base.arrays)
    failing.requested = []
    failing.fail_at = 57  # chunk 5 of 10
    progress: list[tuple[int, int]] = []
    with pytest.raises(RuntimeError, match="source died at item 57"):
        CachedDataset.build(
            failing, uri, chunk_size=10, progress=lambda d, t: progress.append((d, t))
        )
    assert progress[-1] == (5, 10)
    with pytest.raises(ConfigError, match=r"incomplete cache \(5 of 10 chunks written"):
        CachedDataset(uri)
    failing.fail_at = None
    failing.requested = []
    cache = CachedDataset.build(failing, uri, chunk_size=10)
    assert min(failing.requested) == 50  # chunks 0-4 were skipped
    assert sorted(failing.requested) == list(range(50, 100))
    clean = CachedDataset.build(base, str(tmp_path / "clean.zarr"), chunk_size=10)
    _assert_same(cache, clean, 100)

    # the stores hold the same chunk files with the same bytes
    def chunk_files(root: Path) -> dict:
        return {
            p.relative_to(root): p.read_bytes()
            for p in root.rglob("*")
            if p.is_file() and "c" in p.relative_to(root).parts
        }

    assert chunk_files(tmp_path / "c.zarr") == chunk_files(tmp_path / "clean.zarr")


def test_stale_cache_is_refused_until_overwrite(tmp_path: Path) -> None:
    uri = str(tmp_path / "c.zarr")
    CachedDataset.build(_dataset(40), uri, chunk_size=8)
    changed = _dataset(40, offset=1.0)
    with pytest.raises(ConfigError, match=r"stale cache.*Pass overwrite=True"):
        CachedDataset.build(changed, uri, chunk_size=8)
    with pytest.raises(ConfigError, match="another layout"):
        CachedDataset.build(_dataset(40), uri, chunk_size=4)
    cache = CachedDataset.build(changed, uri, chunk_size=8, overwrite=True)
    assert cache.fingerprint() == changed.fingerprint()
    _assert_same(cache, changed, 40)


def test_validation_errors_leave_nothing_behind(tmp_path: Path) -> None:
    uri = tmp_path / "never.zarr"
    ds = _dataset(10)
    bad_calls = [
        dict(chunk_size=0),
        dict(chunk_size=2.5),
        dict(workers=-1),
        dict(workers=1, mp_context="threads"),
        dict(progress="yes"),
        dict(overwrite="no"),
        dict(memory_budget_bytes=-5),
        dict(shuffle_window=0),
        dict(storage_options={"anon": True}),
        dict(executor="threads"),
        dict(executor="ray", workers=2),  # Ray runs one task per chunk: no local workers
    ]
    for kwargs in bad_calls:
        with pytest.raises(ConfigError):
            CachedDataset.build(ds, uri, **kwargs)
        assert not uri.exists(), kwargs
    with pytest.raises(ConfigError, match="must be picklable"):
        CachedDataset.build(
            SimulationDataset(lambda t: t, lambda r: r.normal(size=1), 4), uri, workers=1
        )
    with pytest.raises(ConfigError, match="stream cannot be cached|must be indexable"):
        CachedDataset.build(iter([]), uri)
    with pytest.raises(ConfigError, match="`uri` must be a local path"):
        CachedDataset.build(ds, "")
    with pytest.raises(ConfigError, match="Ray workers cannot write to it"):
        CachedDataset.build(ds, _memory_uri(), executor="ray")
    for options in (
        dict(num_cpus=-1),
        dict(num_gpus=float("nan")),
        dict(resources={"gpu_slot": -0.5}),
        dict(resources=["simulator"]),
        dict(max_in_flight=0),
        dict(max_retries=True),
        dict(address=""),
        dict(runtime_env="env.yaml"),
    ):
        with pytest.raises(ConfigError):
            RayBuildExecutor(**options)  # type: ignore[arg-type]
    assert not uri.exists()


def test_refuses_foreign_data_and_missing_caches(tmp_path: Path) -> None:
    folder = tmp_path / "not_a_cache"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    for overwrite in (False, True):
        with pytest.raises(ConfigError, match="not a pipekit cache; refusing"):
            CachedDataset.build(_dataset(10), folder, overwrite=overwrite)
    assert (folder / "notes.txt").read_text() == "keep me"
    with pytest.raises(ConfigError, match="holds no cache"):
        CachedDataset(tmp_path / "missing.zarr")
    with pytest.raises(ConfigError, match="holds no cache"):
        CachedDataset(_memory_uri())


def test_out_of_core_reading_uses_whole_chunks_and_a_chunk_aware_order(tmp_path: Path) -> None:
    n = 1000
    ds = ArrayDataset(x=np.arange(n * 2, dtype=np.float32).reshape(n, 2), y=np.arange(n)[:, None])
    CachedDataset.build(ds, tmp_path / "c.zarr", chunk_size=50)
    cache = CachedDataset(tmp_path / "c.zarr", memory_budget_bytes=0, shuffle_window=4)
    it = make_batches(cache, 40, seed=3, num_epochs=2)
    assert it.get_state()["order"] == "chunked:50x4"
    seen = []
    for batch in it:
        np.testing.assert_array_equal(batch["x"][:, 0], batch["y"][:, 0] * 2)
        seen.append(batch["y"][:, 0])
    epoch0 = np.concatenate(seen[:25])
    assert sorted(epoch0.tolist()) == list(range(n))
    assert not np.array_equal(epoch0, np.concatenate(seen[25:]))  # reshuffled
    assert cache.chunk_reads <= 2 * 20 + 2  # about one read per chunk per epoch
    threaded = CachedDataset(tmp_path / "c.zarr", memory_budget_bytes=0, shuffle_window=4)
    with_prefetch = list(make_batches(threaded, 40, seed=3, num_epochs=2, prefetch=3))
    np.testing.assert_array_equal(
        np.concatenate([b["y"][:, 0] for b in with_prefetch]), np.concatenate(seen)
    )
    assert threaded.chunk_reads <= 2 * 20 + 2  # concurrent readers share one read per chunk
    # the same seed gives the same order in a fresh process-like reopen
    other = CachedDataset(tmp_path / "c.zarr", memory_budget_bytes=0, shuffle_window=4)
    first = next(make_batches(other, 40, seed=3))
    np.testing.assert_array_equal(first["y"][:, 0], seen[0])
    # resuming with another shuffle order is refused
    in_memory = CachedDataset(tmp_path / "c.zarr")
    resumed = make_batches(in_memory, 40, seed=3, num_epochs=2)
    with pytest.raises(ConfigError, match="order"):
        resumed.set_state(it.get_state())
    # a split of a cache gathers through the cache
    train, val = split(cache, (0.9, 0.1), seed=0)
    np.testing.assert_array_equal(val.get_batch(np.arange(5))["y"][:, 0], val.indices[:5])


def test_out_of_core_gathers_past_capacity_and_recovers_from_a_failed_read(
    tmp_path: Path,
) -> None:
    ds = _dataset(100)
    CachedDataset.build(ds, tmp_path / "c.zarr", chunk_size=16)
    cache = CachedDataset(tmp_path / "c.zarr", memory_budget_bytes=0, shuffle_window=1)
    order = np.random.default_rng(1).permutation(100)
    for rows in (order, order[:10], np.array([99, 0, 99]), np.array([], dtype=np.int64)):
        got = cache.get_batch(rows)  # 7 chunks for 2 slots: the rest are read uncached
        for key, value in ds.get_batch(rows).items():
            assert got[key].dtype == value.dtype
            np.testing.assert_array_equal(got[key], value)
    with pytest.raises(IndexError):
        cache.get_batch(np.array([100]))
    # a chunk that cannot be decoded fails the gather; once repaired it is read again
    chunk = tmp_path / "c.zarr" / "x" / "c" / "3" / "0"
    good = chunk.read_bytes()
    chunk.write_bytes(b"not zstd")
    fresh = CachedDataset(tmp_path / "c.zarr", memory_budget_bytes=0)
    with pytest.raises(Exception, match="(?i)zstd|decompress|frame|size"):
        fresh.get_batch(np.arange(40, 60))
    chunk.write_bytes(good)
    np.testing.assert_array_equal(fresh.get_batch(np.arange(40, 60))["x"], ds.arrays["x"][40:60])
    assert fresh.chunk_reads == 2  # chunks 2 and 3, once each


@pytest.mark.parametrize("where", ["local", "memory"])
def test_out_of_core_reads_chunk_files_directly_and_falls_back_to_zarr(
    tmp_path: Path, where: str
) -> None:
    n = 70  # 5 chunks of 16 rows, the last one partial
    rng = np.random.default_rng(3)
    z = np.zeros((n, 2, 3), dtype=np.float64)
    z[40:] = rng.normal(size=(n - 40, 2, 3))  # chunks 0-1 are all fill value: never written
    ds = ArrayDataset(
        x=rng.normal(size=(n, 3)).astype(np.float32),
        y=np.arange(n, dtype=np.int64),
        mask=(np.arange(n) % 3 == 0),
        z=z,
    )
    uri = str(tmp_path / "c.zarr") if where == "local" else _memory_uri()
    CachedDataset.build(ds, uri, chunk_size=16)
    cache = CachedDataset(uri, memory_budget_bytes=0)
    assert cache._files is not None  # the layout `build` writes: read from the files
    order = np.random.default_rng(0).permutation(n)
    direct = cache.get_batch(order)
    via_zarr = {
        k: np.concatenate([c[k] for c in cache._read_chunks_zarr(range(5))]) for k in ds.keys
    }
    for key, value in ds.get_batch(order).items():
        assert direct[key].dtype == value.dtype and direct[key].shape == value.shape
        np.testing.assert_array_equal(direct[key], value)
        np.testing.assert_array_equal(via_zarr[key][order], value)

    # another codec layout is read through zarr, with the same results
    import zarr

    other = str(tmp_path / "other.zarr")
    CachedDataset.build(ds, other, chunk_size=16)
    group = zarr.open_group(other, mode="r+")
    meta = dict(group.attrs["pipekit_cache"])
    del group["x"]
    group.create_array("x", data=ds.arrays["x"], chunks=(16, 3), compressors=None)
    group.attrs["pipekit_cache"] = meta
    fallback = CachedDataset(other, memory_budget_bytes=0)
    assert fallback._files is None
    np.testing.assert_array_equal(fallback.get_batch(order)["x"], ds.get_batch(order)["x"])


def test_simulation_cache_in_memory_store_records_stats() -> None:
    def prior(rng: np.random.Generator) -> np.ndarray:
        return rng.uniform(-1, 1, size=2)

    def sim(theta: np.ndarray) -> np.ndarray:
        return np.array([np.nan]) if theta[0] > 0.5 else np.array([theta.sum()])

    ds = SimulationDataset(sim, prior, 40, seed=1, on_invalid="resample")
    cache = CachedDataset.build(ds, _memory_uri(), chunk_size=8)
    assert cache.meta["source_stats"]["resampled"] == ds.stats["resampled"] > 0
    assert cache.fingerprint() == ds.fingerprint()
    _assert_same(cache, ds, 40)


_HELPER = """
import numpy as np


def prior(rng):
    return rng.normal(size=3)


def simulator(theta, rng):
    # stochastic: all of its randomness comes from the per-item `rng` it is given
    if theta[0] > 1.2:
        return np.array([np.inf, 0.0])
    noise = 0.05 * rng.standard_normal(2)
    return (np.array([np.tanh(theta).sum(), np.cos(theta[1])]) + noise).astype(np.float32)
"""


def test_parallel_build_gives_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spawned workers (own interpreter, own hash seed) write the parent's bytes, also for
    a stochastic simulator: its noise depends only on (seed, i)."""
    # spawn workers import the simulator by module name: put it in an importable module
    (tmp_path / "pipekit_sim_helper.py").write_text(textwrap.dedent(_HELPER))
    monkeypatch.syspath_prepend(str(tmp_path))
    helper = __import__("pipekit_sim_helper")
    serial_ds = SimulationDataset(helper.simulator, helper.prior, 90, seed=2, on_invalid="drop")
    serial = CachedDataset.build(serial_ds, tmp_path / "serial.zarr", chunk_size=16)
    parallel_ds = SimulationDataset(helper.simulator, helper.prior, 90, seed=2, on_invalid="drop")
    parallel = CachedDataset.build(
        parallel_ds, tmp_path / "parallel.zarr", chunk_size=16, workers=2
    )
    assert len(parallel) == len(serial) < 90
    assert parallel_ds.stats == serial_ds.stats  # worker counters are merged back
    _assert_same(parallel, serial, len(serial))
    assert parallel.fingerprint() == serial.fingerprint()
    assert serial_ds.simulator_takes_rng
    _assert_same(parallel, serial_ds, len(serial))  # the uncached items, simulated here
