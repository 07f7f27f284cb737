"""`CachedDataset`: a dataset materialised in a zarr v3 group (local or any fsspec URI).

Layout of a cache at `uri`: a zarr v3 group with one array per sample key, shape
`(n, *sample_shape)`, chunked `chunk_size` rows along axis 0, plus a boolean
`_pipekit_done` array (one element per chunk) marking the chunks whose rows are
all written. The group attribute `pipekit_cache` records the source fingerprint,
the layout and whether the build completed.

Reading is chunk-aware: each zarr read call costs ~1 ms, so rows are never read one
by one. A cache whose arrays fit in `memory_budget_bytes` is loaded whole when
opened (one read per key); a larger one keeps an LRU cache of whole chunks
(`_chunk_lru`: one `take` per gather), reads chunks straight from their files
(`_chunk_files`), and declares a chunk-aware shuffle (`chunk_size`,
`shuffle_window`) that `make_batches` uses, so a shuffled epoch reads each chunk
about once.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.data.datasets._dataset import ArraySpec, Batch, Sample, block_rows

from ._chunk_files import ChunkFiles
from ._chunk_lru import ChunkCache
from ._zarr_store import (
    DONE_KEY,
    FORMAT_VERSION,
    local_path,
    read_meta,
    uri_string,
)

if TYPE_CHECKING:
    from ._ray_build import RayBuildExecutor

__all__ = ["CachedDataset"]

DEFAULT_MEMORY_BUDGET = 1 << 30
DEFAULT_SHUFFLE_WINDOW = 16


def check_read_options(memory_budget_bytes: Any, shuffle_window: Any) -> None:
    """Validate the reading options of a `CachedDataset`."""
    if (
        isinstance(memory_budget_bytes, bool)
        or not isinstance(memory_budget_bytes, (int, np.integer))
        or memory_budget_bytes < 0
    ):
        raise ConfigError(
            "`memory_budget_bytes` must be a non-negative int. "
            f"Received: memory_budget_bytes={memory_budget_bytes!r}. Use e.g. 2**30."
        )
    if not (
        shuffle_window is None
        or shuffle_window == "auto"
        or (
            isinstance(shuffle_window, (int, np.integer))
            and not isinstance(shuffle_window, bool)
            and shuffle_window > 0
        )
    ):
        raise ConfigError(
            "`shuffle_window` must be 'auto', None or a positive number of chunks. "
            f"Received: shuffle_window={shuffle_window!r}."
        )


class CachedDataset:
    """A dataset read from a zarr v3 cache built by `CachedDataset.build`.

    Args:
        uri: a local path or an fsspec URL (`s3://...`, `gs://...`, `memory://...`).
        storage_options: options for the fsspec filesystem (credentials, endpoint).
        memory_budget_bytes: load the whole cache into memory when its arrays fit
            this many bytes (default 1 GiB); otherwise read whole chunks on demand
            into an LRU chunk cache of about this size.
        shuffle_window: the chunk-aware shuffle `make_batches` uses: `"auto"` (a
            full permutation when loaded in memory, else windows of 16 chunks),
            None (always a full permutation) or a number of chunks per window. The
            epoch order depends on it: keep it fixed across a resume (the iterator
            state records it and refuses a mismatch).

    Raises:
        ConfigError: nothing at `uri`, not a pipekit cache, or an incomplete build.
    """

    def __init__(
        self,
        uri: str | os.PathLike[str],
        *,
        storage_options: Mapping[str, Any] | None = None,
        memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET,
        shuffle_window: int | str | None = "auto",
    ) -> None:
        self.uri = uri_string(uri)
        check_read_options(memory_budget_bytes, shuffle_window)
        opened = read_meta(self.uri, storage_options)
        if opened is None:
            raise ConfigError(
                f"`uri` holds no cache. Received: uri={self.uri!r}. Build one with "
                "CachedDataset.build(dataset, uri)."
            )
        group, meta = opened
        if not isinstance(meta, Mapping) or meta.get("format") != FORMAT_VERSION:
            raise ConfigError(
                f"`uri` holds a zarr group that is not a pipekit cache (format {FORMAT_VERSION}). "
                f"Received: uri={self.uri!r}. Build one with CachedDataset.build(dataset, uri)."
            )
        if not meta.get("complete"):
            done = int(np.count_nonzero(group[DONE_KEY][:]))
            raise ConfigError(
                f"`uri` holds an incomplete cache ({done} of {meta['num_chunks']} chunks written; "
                f"the build was interrupted). Received: uri={self.uri!r}. Resume it with "
                "CachedDataset.build(dataset, uri) on the same dataset."
            )
        self._meta = dict(meta)
        self._length = int(meta["num_samples"])
        self.chunk_size: int = int(meta["chunk_size"])
        self._spec = {k: ArraySpec.from_json(v) for k, v in meta["keys"].items()}
        self._zarrays = {k: group[k] for k in self._spec}
        row_bytes = sum(
            int(np.prod(s.shape, dtype=np.int64)) * s.dtype.itemsize for s in self._spec.values()
        )
        self.nbytes = row_bytes * self._length
        self.in_memory = self.nbytes <= memory_budget_bytes
        if shuffle_window == "auto":
            shuffle_window = None if self.in_memory else DEFAULT_SHUFFLE_WINDOW
        self.shuffle_window: int | None = None if shuffle_window is None else int(shuffle_window)
        self._data: dict[str, np.ndarray] | None = None
        self._files: ChunkFiles | None = None
        if self.in_memory:
            self._data = {k: np.asarray(z[...]) for k, z in self._zarrays.items()}
        else:
            self._files = ChunkFiles.open(
                local_path(self.uri),
                self.uri,
                storage_options,
                self._zarrays,
                self._length,
                self.chunk_size,
            )
        window = self.shuffle_window or DEFAULT_SHUFFLE_WINDOW
        chunk_bytes = max(1, row_bytes * self.chunk_size)
        self._chunks = ChunkCache(
            self._spec,
            self._length,
            self.chunk_size,
            max(2 * window, int(memory_budget_bytes) // chunk_bytes),
            self._read_chunks,
        )

    # -- metadata ----------------------------------------------------------------------
    @property
    def meta(self) -> dict[str, Any]:
        """The `pipekit_cache` group attribute (source fingerprint, layout, build info)."""
        return dict(self._meta)

    @property
    def element_spec(self) -> dict[str, ArraySpec]:
        """Shape and dtype per key."""
        return dict(self._spec)

    @property
    def keys(self) -> tuple[str, ...]:
        """The sample keys."""
        return tuple(self._spec)

    @property
    def gather_block_rows(self) -> int:
        """Rows `make_batches` may gather in one call (a pure row gather; ~4 MiB)."""
        return block_rows(self._spec)

    def fingerprint(self) -> str:
        """The fingerprint of the source the cache was built from (same content, same digest)."""
        return str(self._meta["source_fingerprint"])

    def __len__(self) -> int:
        return self._length

    # -- reading -----------------------------------------------------------------------
    @property
    def chunk_reads(self) -> int:
        """Chunks read from the store so far (out-of-core reading)."""
        return self._chunks.reads

    def _read_chunks(
        self, cids: Sequence[int], into: Sequence[dict[str, np.ndarray] | None]
    ) -> list[dict[str, np.ndarray]]:
        """Read whole chunks `cids` (all keys): straight from the chunk files (into
        their slots `into`) when the arrays have the layout `build` writes, else
        through zarr (concurrently)."""
        if self._files is not None:
            return self._files.read(cids, into)
        return self._read_chunks_zarr(cids)

    def _read_chunks_zarr(self, cids: Sequence[int]) -> list[dict[str, np.ndarray]]:
        """Read whole chunks `cids` (all keys) through zarr, concurrently in one call."""
        import asyncio

        sync = importlib.import_module("zarr.core.sync").sync
        bounds = [(c * self.chunk_size, min(self._length, (c + 1) * self.chunk_size)) for c in cids]
        arrays = [z.async_array for z in self._zarrays.values()]

        async def read_all() -> list[Any]:
            reads = [a.getitem(slice(s, e)) for s, e in bounds for a in arrays]
            return list(await asyncio.gather(*reads))

        flat = sync(read_all())
        keys = list(self._zarrays)
        return [
            {k: np.asarray(flat[i * len(keys) + j]) for j, k in enumerate(keys)}
            for i in range(len(bounds))
        ]

    def get_batch(self, indices: np.ndarray) -> Batch:
        """Gather rows: from memory, or from whole chunks held in the LRU chunk cache."""
        idx = np.asarray(indices, dtype=np.intp)
        if self._data is not None:
            return {k: a.take(idx, axis=0) for k, a in self._data.items()}
        if idx.size and (idx.min() < 0 or idx.max() >= self._length):
            raise IndexError(f"indices out of range for a dataset of {self._length}")
        return self._chunks.gather(idx)

    def __getitem__(self, index: int) -> Sample:
        i = int(index)
        if not -self._length <= i < self._length:
            raise IndexError(f"index {index} is out of range for a dataset of {self._length}")
        batch = self.get_batch(np.array([i % self._length]))
        return {k: v[0] for k, v in batch.items()}

    # -- building ----------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        dataset: Any,
        uri: str | os.PathLike[str],
        *,
        chunk_size: int | None = None,
        progress: bool | Callable[[int, int], None] = False,
        workers: int = 0,
        storage_options: Mapping[str, Any] | None = None,
        overwrite: bool = False,
        mp_context: str = "spawn",
        memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET,
        shuffle_window: int | str | None = "auto",
        executor: str | RayBuildExecutor = "process",
    ) -> CachedDataset:
        """Write `dataset` into a zarr v3 cache at `uri` (resumable) and open it.

        Every argument is validated, and the source fingerprinted, before anything is
        written. If `uri` already holds a cache of the same source, the build resumes:
        chunks marked done are skipped (a complete cache is returned as is). A cache of
        another source (a different fingerprint) is refused unless `overwrite=True`.

        Args:
            dataset: an indexable dataset with a fixed element spec (numeric dtypes).
            uri: a local path or an fsspec URL (`s3://`, `gs://`, `memory://`, ...).
            chunk_size: rows per chunk along axis 0; None picks about 1 MiB per chunk
                of the widest key. Also the unit of resumption and of parallel work.
            progress: True shows a tqdm bar; a callable gets `(chunks_done, chunks)`.
            workers: compute rows in this many local processes (0: in this process).
                Meant for expensive sources such as `SimulationDataset`; the bytes are
                the same as a serial build. The dataset must be picklable.
            storage_options: fsspec filesystem options for URLs.
            overwrite: delete an existing cache at `uri` (of any source) and rebuild.
            mp_context: `"spawn"` (default), `"forkserver"` or `"fork"`.
            memory_budget_bytes: forwarded to the returned `CachedDataset`.
            shuffle_window: forwarded to the returned `CachedDataset`.
            executor: where chunks are computed. `"process"` (default): here, or in
                `workers` local processes. `"ray"` or a `RayBuildExecutor` (address,
                resources per task, retries): one Ray task per chunk, each writing
                its chunk straight to `uri`, which every Ray node must reach (an
                object store, a shared filesystem, or a local path on one machine).
                Resumable and byte-identical to a serial build like the others.
                Needs `pip install 'pipekit-train-core[ray]'`.

        Returns:
            The opened `CachedDataset`.

        Raises:
            ConfigError: invalid arguments, a stale cache, a non-cache at `uri`, or a
                sample that does not match the element spec.
        """
        from ._build import build_cache

        check_read_options(memory_budget_bytes, shuffle_window)
        build_cache(
            dataset,
            uri_string(uri),
            chunk_size=chunk_size,
            progress=progress,
            workers=workers,
            storage_options=storage_options,
            overwrite=overwrite,
            mp_context=mp_context,
            executor=executor,
        )
        return cls(
            uri,
            storage_options=storage_options,
            memory_budget_bytes=memory_budget_bytes,
            shuffle_window=shuffle_window,
        )

    def __repr__(self) -> str:
        mode = "in memory" if self.in_memory else f"chunked, window={self.shuffle_window}"
        return (
            f"CachedDataset({self.uri!r}, n={self._length}, chunk_size={self.chunk_size}, {mode})"
        )
