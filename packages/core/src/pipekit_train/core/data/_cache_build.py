"""Building a `CachedDataset`: validate, fingerprint, then write chunk by chunk (resumable)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError

from ._cached import DONE_KEY, FORMAT_VERSION, META_KEY, open_store, read_meta, zarr_module
from ._dataset import ArraySpec, as_sample, check_key, check_numeric, spec_of
from ._hashing import Hasher
from ._workers import check_workers, compute_blocks, open_pool

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


def _check_batch(batch: Any, spec: Mapping[str, ArraySpec], start: int, stop: int) -> None:
    keys = sorted(batch) if isinstance(batch, Mapping) else None
    if keys != sorted(spec):
        raise ConfigError(
            f"Samples {start}..{stop - 1} have keys {keys}, but sample 0 has {sorted(spec)}. "
            "Received: samples with different keys. Make every sample have the same keys."
        )
    for key, s in spec.items():
        arr = batch[key]
        if arr.shape != (stop - start, *s.shape) or arr.dtype != s.dtype:
            raise ConfigError(
                f"Samples {start}..{stop - 1} of key {key!r} do not match sample 0. Received: "
                f"shape {arr.shape[1:]} and dtype {arr.dtype}, expected shape {s.shape} and dtype "
                f"{s.dtype}. Make every sample the same shape and dtype."
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
    workers = check_workers(dataset, workers, mp_context)
    pool = open_pool(dataset, workers, mp_context) if workers else None
    try:
        _build(
            dataset,
            uri,
            chunk_size,
            progress,
            workers,
            storage_options,
            overwrite,
            mp_context,
            pool,
        )
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _build(
    dataset: Any,
    uri: str,
    chunk_size: int | None,
    progress: Any,
    workers: int,
    storage_options: Mapping[str, Any] | None,
    overwrite: bool,
    mp_context: str,
    pool: Any,
) -> None:
    scan = getattr(dataset, "scan", None)
    if pool is not None and callable(scan) and getattr(dataset, "on_invalid", None) == "drop":
        scan(workers=workers, mp_context=mp_context, pool=pool)  # scan in parallel
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
    zarr = zarr_module()
    store = open_store(uri, storage_options, read_only=False)
    if meta is None:
        cs = int(chunk_size) if chunk_size is not None else _auto_chunk_size(n, spec)
        meta = _new_meta(fingerprint, n, cs, spec, dataset)
        group = zarr.open_group(store, mode="w", attributes={META_KEY: meta})
    else:
        group = zarr.open_group(store, mode="r+")
    _ensure_arrays(group, meta)
    _write_chunks(dataset, group, meta, spec, progress, workers, mp_context, pool)
    meta = {**meta, "complete": True}
    stats = getattr(dataset, "stats", None)
    if isinstance(stats, dict):
        meta["source_stats"] = {str(k): int(v) for k, v in stats.items()}
    group.attrs[META_KEY] = meta


def _write_chunks(
    dataset: Any,
    group: Any,
    meta: Mapping[str, Any],
    spec: Mapping[str, ArraySpec],
    progress: Any,
    workers: int,
    mp_context: str,
    pool: Any,
) -> None:
    n, cs, num_chunks = meta["num_samples"], meta["chunk_size"], meta["num_chunks"]
    done_array = group[DONE_KEY]
    done = np.asarray(done_array[:], dtype=bool)
    todo = [c for c in range(num_chunks) if not done[c]]
    arrays = {k: group[k] for k in spec}
    blocks: list[tuple[int, int]] = []
    for c in todo:
        start, stop = c * cs, min(n, (c + 1) * cs)
        edges = np.unique(np.linspace(start, stop, max(1, workers) + 1).astype(np.int64))
        blocks.extend(zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True))
    report, bar = _progress_fn(progress, num_chunks, num_chunks - len(todo))
    stats = getattr(dataset, "stats", None)
    finished = num_chunks - len(todo)
    parts: list[Mapping[str, np.ndarray]] = []
    try:
        results = compute_blocks(
            dataset, "rows", blocks, workers=workers, mp_context=mp_context, pool=pool
        )
        for (start, stop), (batch, delta) in zip(blocks, results, strict=True):
            if workers and delta and isinstance(stats, dict):
                for key, value in delta.items():
                    if key != "dropped":
                        stats[key] = stats.get(key, 0) + int(value)
            _check_batch(batch, spec, start, stop)
            parts.append(batch)
            if stop % cs == 0 or stop == n:
                cid = (stop - 1) // cs
                chunk_start = cid * cs
                for key, zarray in arrays.items():
                    values = (
                        parts[0][key]
                        if len(parts) == 1
                        else np.concatenate([p[key] for p in parts])
                    )
                    zarray[chunk_start:stop] = values
                done_array[cid] = True
                parts = []
                finished += 1
                report(finished)
    finally:
        if bar is not None:
            bar.close()
