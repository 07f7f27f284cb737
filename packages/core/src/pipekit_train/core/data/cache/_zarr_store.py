"""The zarr v3 store of a `CachedDataset`: its location, its metadata keys, opening it.

Shared by reading (`_cached`), building (`_build`, `_ray_build`) and the chunk
writer (`_write_chunk`).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any

from pipekit_train.core._errors import ConfigError

__all__ = [
    "DONE_KEY",
    "FORMAT_VERSION",
    "META_KEY",
    "open_store",
    "local_path",
    "read_meta",
    "uri_string",
    "zarr_module",
]

META_KEY = "pipekit_cache"
DONE_KEY = "_pipekit_done"
FORMAT_VERSION = 1


def zarr_module() -> Any:
    """Import zarr lazily (it costs ~1 s; `import pipekit_train.core` must stay fast)."""
    return importlib.import_module("zarr")


def uri_string(uri: Any) -> str:
    """Validate a cache URI (a path or an fsspec URL) and return it as a string."""
    if isinstance(uri, os.PathLike):
        uri = os.fspath(uri)
    if not isinstance(uri, str) or not uri:
        raise ConfigError(
            "`uri` must be a local path or an fsspec URL such as 's3://bucket/cache.zarr'. "
            f"Received: uri={uri!r}."
        )
    return uri


def local_path(uri: str) -> str | None:
    if uri.startswith("file://"):
        return uri[len("file://") :]
    return None if "://" in uri else uri


def open_store(uri: str, storage_options: Mapping[str, Any] | None, *, read_only: bool) -> Any:
    """A zarr store for `uri`: `LocalStore` for paths, `FsspecStore` for other URLs."""
    zarr = zarr_module()
    local = local_path(uri)
    if local is not None:
        if storage_options:
            raise ConfigError(
                "`storage_options` only apply to fsspec URLs. Received: storage_options="
                f"{dict(storage_options)!r} for the local path {uri!r}."
            )
        return zarr.storage.LocalStore(local, read_only=read_only)
    return zarr.storage.FsspecStore.from_url(
        uri, storage_options=dict(storage_options or {}), read_only=read_only
    )


def read_meta(uri: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, Any] | None:
    """Open the group at `uri` read-only: `(group, meta)`, `(group, None)` or None if absent."""
    zarr = zarr_module()
    try:
        group = zarr.open_group(open_store(uri, storage_options, read_only=True), mode="r")
    except (FileNotFoundError, zarr.errors.BaseZarrError):
        return None
    return group, group.attrs.get(META_KEY)
