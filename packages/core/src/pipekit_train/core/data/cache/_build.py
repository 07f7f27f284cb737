"""Building a `CachedDataset`: validate, fingerprint, then write chunk by chunk (resumable)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.data.datasets._dataset import (
    ArraySpec,
    as_sample,
    check_key,
    check_numeric,
    spec_of,
)
from pipekit_train.core.data.datasets._hashing import Hasher
from pipekit_train.core.data.datasets._workers import (
    check_workers,
    compute_blocks,
    open_pool,
    raw_indices,
)

from ._ray_build import RayBuildExecutor, RaySession, ray_session
from ._write_chunk import check_batch, open_chunk_arrays, write_chunk
from ._zarr_store import (
    DONE_KEY,
    FORMAT_VERSION,
    META_KEY,
    open_store,
    read_meta,
    zarr_module,
)

__all__ = ["build_cache"]

_TARGET_CHUNK_BYTES = 1 << 20


def _spec(dataset: Any) -> dict[str, ArraySpec]:
    spec = getattr(dataset, "element_spec", None)
    if spec is None:
        spec = spec_of(as_sample(dataset[0], where="dataset[0]"))
    for key, s in spec.items():
        check_key(key, field="dataset")
        check_numeric(key, np.empty(0, dtype=s.dtype), where="CachedDataset.build")
    return dict(spec)


def _fingerprint(dataset: Any, n: int, spec: Mapping[str, ArraySpec]) -> str:
    fingerprint = getattr(dataset, "fingerprint", None)
    if callable(fingerprint):
        return str(fingerprint())
    h = Hasher("generic")  # no fingerprint(): type, layout and a content probe
    h.update_json({"type": f"{type(dataset).__module__}:{type(dataset).__qualname__}", "n": n})
    h.update_json({k: s.to_json() for k, s in spec.items()})
    for i in sorted({0, n - 1}):
        h.update_sample(as_sample(dataset[i], where=f"dataset[{i}]"))
    return h.hexdigest()


def _auto_chunk_size(n: int, spec: Mapping[str, ArraySpec]) -> int:
    widest = max(
        max(1, int(np.prod(s.shape, dtype=np.int64)) * s.dtype.itemsize) for s in spec.values()
    )
    return int(min(n, max(1, _TARGET_CHUNK_BYTES // widest)))


def _check_location_empty(uri: str, storage_options: Mapping[str, Any] | None) -> None:
    url_to_fs = importlib.import_module("fsspec.core").url_to_fs
    fs, path = url_to_fs(uri, **dict(storage_options or {}))
    if fs.exists(path) and (fs.isfile(path) or fs.ls(path)):
        raise ConfigError(
            "`uri` points at existing data that is not a pipekit cache; refusing to overwrite "
            f"it. Received: uri={uri!r}. Choose another uri, or delete it yourself."
        )


def _new_meta(
    fingerprint: str, n: int, chunk_size: int, spec: Mapping[str, ArraySpec], dataset: Any
) -> dict[str, Any]:
    return {
        "format": FORMAT_VERSION,
        "source_fingerprint": fingerprint,
        "source_type": type(dataset).__name__,
        "num_samples": n,
        "chunk_size": chunk_size,
        "num_chunks": -(-n // chunk_size),
        "keys": {k: s.to_json() for k, s in spec.items()},
        "complete": False,
    }


def _ensure_arrays(group: Any, meta: Mapping[str, Any]) -> None:
    n, cs = meta["num_samples"], meta["chunk_size"]
    existing = set(group.array_keys())
    for key, entry in meta["keys"].items():
        if key not in existing:
            shape = tuple(entry["shape"])
            group.create_array(
                name=key,
                shape=(n, *shape),
                chunks=(cs, *shape),
                dtype=entry["dtype"],
                fill_value=0,
            )
    if DONE_KEY not in existing:
        group.create_array(
            name=DONE_KEY,
            shape=(meta["num_chunks"],),
            chunks=(1,),
            dtype="bool",
            fill_value=False,
        )


def _progress_fn(progress: Any, total: int, initial: int) -> tuple[Callable[[int], None], Any]:
    if callable(progress) and not isinstance(progress, bool):
        return (lambda done: progress(done, total)), None
    if progress:
        tqdm = importlib.import_module("tqdm").tqdm
        bar = tqdm(total=total, initial=initial, unit="chunk", desc="CachedDataset.build")
        return (lambda done: bar.update(1)), bar
    return (lambda done: None), None


def check_executor(executor: Any, workers: Any, uri: str) -> RayBuildExecutor | None:
    """Validate `executor`: None for local processes, else the `RayBuildExecutor` to use."""
    if isinstance(executor, str) and executor == "process":
        return None
    if isinstance(executor, str) and executor == "ray":
        executor = RayBuildExecutor()
    if not isinstance(executor, RayBuildExecutor):
        raise ConfigError(
            "`executor` must be 'process', 'ray' or a RayBuildExecutor. "
            f"Received: executor={executor!r}."
        )
    if workers != 0:
        raise ConfigError(
            "`workers` counts local processes (executor='process'); a Ray build runs one task "
            f"per chunk. Received: workers={workers!r} with executor={executor!r}. Drop "
            "`workers`, or limit the tasks with RayBuildExecutor(max_in_flight=...)."
        )
    if uri.startswith("memory://"):
        raise ConfigError(
            "A `memory://` filesystem lives in one process, so Ray workers cannot write to it. "
            f"Received: uri={uri!r} with executor={executor!r}. Use a path or an object store "
            "URL, or executor='process'."
        )
    return executor


def build_cache(
    dataset: Any,
    uri: str,
    *,
    chunk_size: int | None,
    progress: bool | Callable[[int, int], None],
    workers: int,
    storage_options: Mapping[str, Any] | None,
    overwrite: bool,
    mp_context: str,
    executor: Any = "process",
) -> None:
    """Write `dataset` to the zarr cache at `uri` (see `CachedDataset.build`)."""
    # -- validate everything before writing anything -----------------------------------
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise ConfigError(
            "`dataset` must be indexable (`len()` and `[i]`); a stream cannot be cached. "
            f"Received: dataset={type(dataset).__name__}."
        )
    if chunk_size is not None and (
        isinstance(chunk_size, bool)
        or not isinstance(chunk_size, (int, np.integer))
        or chunk_size < 1
    ):
        raise ConfigError(
            f"`chunk_size` must be a positive int or None. Received: chunk_size={chunk_size!r}. "
            "Use e.g. chunk_size=4096 rows."
        )
    if not isinstance(overwrite, bool):
        raise ConfigError(f"`overwrite` must be a bool. Received: overwrite={overwrite!r}.")
    if not (isinstance(progress, bool) or callable(progress)):
        raise ConfigError(
            "`progress` must be a bool or a callable(done, total). "
            f"Received: progress={progress!r}."
        )
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise ConfigError(
            f"`storage_options` must be a dict. Received: storage_options={storage_options!r}."
        )
    ray_executor = check_executor(executor, workers, uri)
    if ray_executor is not None:
        check_workers(dataset, 0, mp_context)
        with contextlib.ExitStack() as stack:
            runner: _ProcessRunner | _RayRunner = _RayRunner(ray_executor, dataset, stack)
            _build(dataset, uri, chunk_size, progress, storage_options, overwrite, runner)
        return
    workers = check_workers(dataset, workers, mp_context)
    pool = open_pool(dataset, workers, mp_context) if workers else None
    try:
        runner = _ProcessRunner(workers, mp_context, pool)
        _build(dataset, uri, chunk_size, progress, storage_options, overwrite, runner)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


class _ProcessRunner:
    """Chunks computed here (`workers=0`) or in a local process pool, written here."""

    def __init__(self, workers: int, mp_context: str, pool: Any) -> None:
        self.workers, self.mp_context, self.pool = workers, mp_context, pool

    def prepare(self) -> None:
        """Nothing to prepare: the pool, if any, is already running."""

    def scan(self, dataset: Any) -> None:
        """Run a `"drop"` simulation's scan in the pool (else it runs on first `len`)."""
        if self.pool is not None:
            dataset.scan(workers=self.workers, mp_context=self.mp_context, pool=self.pool)

    def write(self, job: _Job) -> None:
        """Compute the chunks to do in blocks (in order); write each chunk when complete."""
        n, cs, spec = job.meta["num_samples"], job.meta["chunk_size"], job.spec
        arrays, done_array = open_chunk_arrays(job.group, spec)
        blocks: list[tuple[int, int]] = []
        for c in job.todo:
            start, stop = c * cs, min(n, (c + 1) * cs)
            edges = np.unique(np.linspace(start, stop, max(1, self.workers) + 1).astype(np.int64))
            blocks.extend(zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True))
        parts: list[Mapping[str, np.ndarray]] = []
        results = compute_blocks(
            job.dataset,
            "rows",
            blocks,
            workers=self.workers,
            mp_context=self.mp_context,
            pool=self.pool,
        )
        for (start, stop), (batch, delta) in zip(blocks, results, strict=True):
            if self.workers:  # computed in a worker: its counters are merged here
                job.merge_stats(delta)
            check_batch(batch, spec, start, stop)
            parts.append(batch)
            if stop % cs == 0 or stop == n:
                cid = (stop - 1) // cs
                values = {
                    k: parts[0][k] if len(parts) == 1 else np.concatenate([p[k] for p in parts])
                    for k in spec
                }
                write_chunk(arrays, done_array, values, cid, cid * cs, stop)
                parts = []
                job.chunk_done()


class _RayRunner:
    """One Ray task per chunk, each writing its chunk to the store.

    Ray is started (or joined) on first need, so an already complete cache opens
    without it; the session ends with `stack`.
    """

    def __init__(
        self, executor: RayBuildExecutor, dataset: Any, stack: contextlib.ExitStack
    ) -> None:
        self.executor, self.dataset, self._stack = executor, dataset, stack
        self._session: RaySession | None = None

    @property
    def session(self) -> RaySession:
        """The Ray session of this build (started on first use)."""
        if self._session is None:
            self._session = self._stack.enter_context(ray_session(self.executor, self.dataset))
        return self._session

    def prepare(self) -> None:
        """Join Ray and send the dataset before anything is written (it may not serialize)."""
        _ = self.session

    def scan(self, dataset: Any) -> None:
        """Run a `"drop"` simulation's scan as Ray tasks."""
        dataset.scan(workers=self.session.workers, pool=self.session.pool())

    def write(self, job: _Job) -> None:
        """Run the chunk tasks, then check that the store shows every chunk done."""

        def finished(delta: dict[str, int] | None) -> None:
            job.merge_stats(delta)
            job.chunk_done()

        self.session.write_chunks(
            job.uri,
            job.storage_options,
            job.meta,
            job.spec,
            job.todo,
            lambda start, stop: raw_indices(job.dataset, start, stop),
            finished,
        )
        done = np.asarray(job.group[DONE_KEY][:], dtype=bool)
        if not done.all():
            missing = np.flatnonzero(~done).tolist()
            raise ConfigError(
                f"Every Ray chunk task succeeded, but the cache shows chunks {missing[:10]} not "
                "done: the workers wrote somewhere this process cannot see. Received: "
                f"uri={job.uri!r}. Use a URI every Ray node reaches under the same name (an "
                "object store such as s3://, or a shared filesystem)."
            )


@dataclasses.dataclass
class _Job:
    """The chunks still to write, and the bookkeeping shared by every runner."""

    dataset: Any
    uri: str
    storage_options: Mapping[str, Any] | None
    group: Any
    meta: Mapping[str, Any]
    spec: Mapping[str, ArraySpec]
    todo: list[int]
    report: Callable[[int], None]
    finished: int

    def merge_stats(self, delta: Mapping[str, int] | None) -> None:
        """Add a worker's change of `dataset.stats` to the dataset here."""
        stats = getattr(self.dataset, "stats", None)
        if delta and isinstance(stats, dict):
            for key, value in delta.items():
                if key != "dropped":
                    stats[key] = stats.get(key, 0) + int(value)

    def chunk_done(self) -> None:
        """Count a chunk written and report progress."""
        self.finished += 1
        self.report(self.finished)


def _build(
    dataset: Any,
    uri: str,
    chunk_size: int | None,
    progress: Any,
    storage_options: Mapping[str, Any] | None,
    overwrite: bool,
    runner: _ProcessRunner | _RayRunner,
) -> None:
    scan = getattr(dataset, "scan", None)
    if callable(scan) and getattr(dataset, "on_invalid", None) == "drop":
        runner.scan(dataset)  # in parallel
    n = len(dataset)
    if n < 1:
        raise ConfigError(
            "`dataset` is empty. Received: a dataset with 0 samples. Cache a non-empty dataset."
        )
    spec = _spec(dataset)
    fingerprint = _fingerprint(dataset, n, spec)
    opened = read_meta(uri, storage_options)
    meta: dict[str, Any] | None = None
    if opened is not None and isinstance(opened[1], Mapping):
        old = dict(opened[1])
        same_source = old.get("source_fingerprint") == fingerprint
        same_layout = (
            old.get("format") == FORMAT_VERSION
            and old.get("num_samples") == n
            and old.get("keys") == {k: s.to_json() for k, s in spec.items()}
            and (chunk_size is None or old.get("chunk_size") == chunk_size)
        )
        if not overwrite:
            if not same_source:
                raise ConfigError(
                    f"`uri` holds a stale cache: it was built from a source with fingerprint "
                    f"{old.get('source_fingerprint')!r}, but this dataset's fingerprint is "
                    f"{fingerprint!r}. Received: uri={uri!r}. Pass overwrite=True to rebuild it, "
                    "or use another uri."
                )
            if not same_layout:
                raise ConfigError(
                    f"`uri` holds a cache of this source with another layout (chunk_size="
                    f"{old.get('chunk_size')}). Received: chunk_size={chunk_size!r}. Use the same "
                    "chunk_size (or None) to resume, or overwrite=True to rebuild."
                )
            meta = old
            if meta.get("complete"):
                return
    else:  # nothing there, or data that is not a pipekit cache (refused even with overwrite)
        _check_location_empty(uri, storage_options)
    # -- write -------------------------------------------------------------------------
    runner.prepare()
    zarr = zarr_module()
    store = open_store(uri, storage_options, read_only=False)
    if meta is None:
        cs = int(chunk_size) if chunk_size is not None else _auto_chunk_size(n, spec)
        meta = _new_meta(fingerprint, n, cs, spec, dataset)
        group = zarr.open_group(store, mode="w", attributes={META_KEY: meta})
    else:
        group = zarr.open_group(store, mode="r+")
    _ensure_arrays(group, meta)
    done = np.asarray(group[DONE_KEY][:], dtype=bool)
    todo = np.flatnonzero(~done).tolist()
    num_chunks = meta["num_chunks"]
    report, bar = _progress_fn(progress, num_chunks, num_chunks - len(todo))
    job = _Job(
        dataset, uri, storage_options, group, meta, spec, todo, report, num_chunks - len(todo)
    )
    try:
        runner.write(job)
    finally:
        if bar is not None:
            bar.close()
    meta = {**meta, "complete": True}
    stats = getattr(dataset, "stats", None)
    if isinstance(stats, dict):
        meta["source_stats"] = {str(k): int(v) for k, v in stats.items()}
    group.attrs[META_KEY] = meta
