"""Whole-chunk reads of a cache's arrays straight from the chunk files.

Reading one whole chunk through zarr costs 1-3 ms of CPU in zarr's asyncio
machinery on top of reading and decompressing it — as much as the work itself,
and it holds the GIL. The arrays `CachedDataset.build` writes have one layout: the
zarr v3 default chunk key encoding (`<key>/c/<chunk>/0/...`), one chunk across the
trailing dimensions, and the codecs `bytes` (little-endian) then `zstd`. For such
arrays the out-of-core reader reads the chunk files itself: one file read (or one
concurrent fetch of all of them on a remote filesystem) and one zstd
decompression per chunk, straight into the chunk cache's buffer; both release the
GIL. A chunk whose file is
absent holds the fill value (zarr does not write chunks that are all fill value).
An array with any other layout (another codec, sharding, a cache written by other
tools) is read through zarr.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["ChunkFiles"]

_DEFAULT_KEYS = {"name": "default", "configuration": {"separator": "/"}}


def _plain_layout(zarray: Any, chunk_size: int) -> bool:
    """Whether `zarray` has the layout `CachedDataset.build` writes (see the module docs)."""
    try:
        meta = zarray.metadata.to_dict()
        dtype = np.dtype(zarray.dtype)
    except (AttributeError, TypeError, ValueError):  # not a zarr v3 array of a numpy dtype
        return False
    codecs = [dict(c) for c in meta.get("codecs", ())]
    if len(codecs) != 2 or [c.get("name") for c in codecs] != ["bytes", "zstd"]:
        return False
    endian = (codecs[0].get("configuration") or {}).get("endian")
    if endian not in ("little", None) or (endian is None and dtype.itemsize > 1):
        return False
    grid = meta.get("chunk_grid") or {}
    chunk_shape = tuple((grid.get("configuration") or {}).get("chunk_shape", ()))
    return (
        meta.get("zarr_format") == 3
        and meta.get("chunk_key_encoding") == _DEFAULT_KEYS
        and grid.get("name") == "regular"
        and chunk_shape == (chunk_size, *zarray.shape[1:])
        and not meta.get("storage_transformers")
        and dtype.kind in "biufc"
    )


class ChunkFiles:
    """Reads whole chunks of a cache's arrays from their files (see the module docs).

    Args:
        root: the group's location: a local directory, or a path on `fs`.
        fs: an fsspec filesystem (sync API), or None for a local directory.
        zarrays: the zarr array of each key (for its shape, dtype and fill value).
        length: rows in the dataset.
        chunk_size: rows per chunk.
    """

    def __init__(
        self,
        root: str,
        fs: Any,
        zarrays: Mapping[str, Any],
        length: int,
        chunk_size: int,
    ) -> None:
        self._root, self._fs = root, fs
        self._length, self._cs = length, chunk_size
        self._keys = list(zarrays)
        self._shape = {k: tuple(z.shape[1:]) for k, z in zarrays.items()}
        self._dtype = {k: np.dtype(z.dtype) for k, z in zarrays.items()}
        self._fill = {k: z.fill_value for k, z in zarrays.items()}
        self._zstd = importlib.import_module("numcodecs").Zstd()

    @classmethod
    def open(
        cls,
        local: str | None,
        uri: str,
        storage_options: Mapping[str, Any] | None,
        zarrays: Mapping[str, Any],
        length: int,
        chunk_size: int,
    ) -> ChunkFiles | None:
        """A reader for the cache at `uri`, or None when an array has another layout.

        Args:
            local: the local directory of the cache, or None for an fsspec URL.
            uri: the cache's URI.
            storage_options: fsspec options for a URL.
            zarrays: the zarr array of each key.
            length: rows in the dataset.
            chunk_size: rows per chunk.
        """
        if not all(_plain_layout(z, chunk_size) for z in zarrays.values()):
            return None
        if local is not None:
            return cls(local, None, zarrays, length, chunk_size)
        url_to_fs = importlib.import_module("fsspec.core").url_to_fs
        fs, root = url_to_fs(uri, **dict(storage_options or {}))
        return cls(str(root).rstrip("/"), fs, zarrays, length, chunk_size)

    def _path(self, key: str, cid: int) -> str:
        trailing = "/0" * len(self._shape[key])
        return f"{self._root}/{key}/c/{cid}{trailing}"

    def _read_local(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def _fetch_remote(self, paths: list[str]) -> list[bytes | None]:
        """The bytes of each remote file (None: absent), fetched concurrently by fsspec."""
        got = self._fs.cat(paths, on_error="return")
        result: list[bytes | None] = []
        for path in paths:
            value = got[path] if path in got else self._cat_one(path)
            if isinstance(value, FileNotFoundError):
                result.append(None)
            elif isinstance(value, BaseException):
                raise value
            else:
                result.append(value)
        return result

    def _cat_one(self, path: str) -> bytes | FileNotFoundError:
        try:
            return bytes(self._fs.cat_file(path))
        except FileNotFoundError as exc:
            return exc

    def _decode(
        self, key: str, raw: bytes | None, rows: int, path: str, into: np.ndarray | None
    ) -> np.ndarray:
        """Chunk rows of `key` from the file's bytes: into `into` (the chunk's slot,
        `chunk_size` rows) when given, else into a new array."""
        shape, dtype = self._shape[key], self._dtype[key]
        if raw is None:  # never written: all fill value
            if into is None:
                return np.full((rows, *shape), self._fill[key], dtype=dtype)
            into[:rows] = self._fill[key]
            return into[:rows]
        expected = self._cs * int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        in_place = into is not None and dtype == dtype.newbyteorder("<")
        try:
            data = self._zstd.decode(raw, out=into if in_place else None)
        except (RuntimeError, ValueError) as exc:
            raise ValueError(
                f"The cache chunk {path} cannot be decompressed ({exc}): the cache is "
                "damaged. Rebuild it with CachedDataset.build(..., overwrite=True)."
            ) from exc
        if in_place:
            assert into is not None
            return into[:rows]
        if len(data) != expected:
            raise ValueError(
                f"The cache chunk {path} decodes to {len(data)} bytes, expected {expected}: "
                "the cache is damaged. Rebuild it with CachedDataset.build(..., overwrite=True)."
            )
        values = np.frombuffer(data, dtype=dtype.newbyteorder("<")).reshape(self._cs, *shape)
        return values[:rows].astype(dtype, copy=False)

    def read(
        self,
        cids: Sequence[int],
        into: Sequence[dict[str, np.ndarray] | None] | None = None,
    ) -> list[dict[str, np.ndarray]]:
        """Whole chunks `cids`, `{key: rows}` for each.

        `into[i]`, when given, is chunk `cids[i]`'s slot (`{key: chunk_size rows}`):
        the chunk is decompressed straight into it and that dict is returned.
        """
        paths = [[self._path(key, cid) for key in self._keys] for cid in cids]
        raws: list[bytes | None] | None = None
        if self._fs is not None:  # one concurrent fetch of every file
            raws = self._fetch_remote([p for chunk in paths for p in chunk])
        out: list[dict[str, np.ndarray]] = []
        for i, cid in enumerate(cids):
            rows = min(self._cs, self._length - cid * self._cs)
            target = into[i] if into is not None else None
            chunk = target if target is not None else {}
            for j, key in enumerate(self._keys):
                path = paths[i][j]
                raw = raws[i * len(self._keys) + j] if raws is not None else self._read_local(path)
                value = self._decode(key, raw, rows, path, None if target is None else target[key])
                if target is None:
                    chunk[key] = value
            out.append(chunk)
        return out
