"""Opening what `XarraySource` reads: an `xarray.Dataset`, a path or an fsspec URI, lazily.

A zarr store (a directory, or a name ending in `.zarr`) opens with `engine="zarr"`, a
`.nc` file with `engine="h5netcdf"` (over fsspec for a remote URI). Every open asks for
lazily indexed backend arrays (`chunks=None`, no dask) without xarray's in-memory cache
(`cache=False`), so nothing is read until a window indexes a variable.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipekit_train.core._errors import ConfigError
from pipekit_train.core._imports import optional_import

__all__ = ["Opened", "import_xarray", "open_data"]

_NETCDF_SUFFIXES = (".nc", ".nc4", ".netcdf", ".cdf", ".h5", ".hdf5", ".he5")
#: xarray warns when a zarr store has no consolidated metadata; reading it is still right.
_CONSOLIDATED_WARNING = "Failed to open Zarr store with consolidated metadata"


def import_xarray() -> Any:
    """`xarray`, or an `ImportError` naming core's `xarray` extra."""
    return optional_import("xarray", extra="xarray", package="pipekit-train-core")


@dataclass
class Opened:
    """An opened dataset and where it came from.

    Attributes:
        dataset: the `xarray.Dataset` (lazy).
        source: the path or URI it was read from (None: an in-memory dataset without one).
        engine: the engine that opened it (None: opened by the user).
        owned: whether it was opened here (and is closed by `close`).
    """

    dataset: Any
    source: str | None
    engine: str | None
    owned: bool
    handle: Any = None  # the fsspec file object under a remote NetCDF file

    def close(self) -> None:
        """Close the dataset (and its file object) when it was opened here."""
        if self.owned:
            self.dataset.close()
            if self.handle is not None:
                self.handle.close()


def _local_path(uri: str) -> str | None:
    if uri.startswith("file://"):
        return uri[len("file://") :]
    return None if "://" in uri else uri


def _engine_for(uri: str, local: str | None) -> str:
    name = uri.rstrip("/").lower()
    if name.endswith(".zarr") or (local is not None and os.path.isdir(local)):
        return "zarr"
    if name.endswith(_NETCDF_SUFFIXES):
        return "h5netcdf"
    raise ConfigError(
        "`engine` is needed: the name says neither zarr nor NetCDF. Received: "
        f"data={uri!r}, engine=None. Pass engine='zarr' for a zarr store or "
        "engine='h5netcdf' for a NetCDF-4 file."
    )


def open_data(
    data: Any, *, engine: str | None, storage_options: Mapping[str, Any] | None
) -> Opened:
    """Open `data` lazily (see the module doc).

    Raises:
        ConfigError: `data` is neither a dataset nor a path/URI, the path does not
            exist, the engine cannot be told from the name, or options that do not apply.
    """
    xr = import_xarray()
    if isinstance(data, xr.Dataset):
        if engine is not None or storage_options:
            raise ConfigError(
                "`engine` and `storage_options` apply to a path or URI, not to an opened "
                f"dataset. Received: engine={engine!r}, storage_options={storage_options!r} "
                "with an xarray.Dataset. Drop them, or pass the path instead."
            )
        source = data.encoding.get("source")
        return Opened(data, str(source) if source else None, None, owned=False)
    if isinstance(data, os.PathLike):
        data = os.fspath(data)
    if not isinstance(data, str) or not data:
        raise ConfigError(
            "`data` must be an xarray.Dataset, a path or an fsspec URI (a zarr store or a "
            f"NetCDF file). Received: data={data!r} ({type(data).__name__})."
        )
    if engine is not None and (not isinstance(engine, str) or not engine):
        raise ConfigError(
            f"`engine` must be an xarray engine name or None. Received: engine={engine!r}. "
            "Use 'zarr' or 'h5netcdf'."
        )
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise ConfigError(
            "`storage_options` must be a dict of fsspec options or None. Received: "
            f"storage_options={storage_options!r}."
        )
    local = _local_path(data)
    if local is not None:
        if storage_options:
            raise ConfigError(
                "`storage_options` only apply to fsspec URLs. Received: storage_options="
                f"{dict(storage_options)!r} for the local path {data!r}. Drop them."
            )
        if not os.path.exists(local):
            raise ConfigError(
                f"`data` names no file or directory. Received: data={data!r}. Pass the path "
                "of a zarr store or a NetCDF file, or an opened xarray.Dataset."
            )
        source = os.path.abspath(local)
    else:
        source = data
    engine = engine or _engine_for(data, local)
    kwargs: dict[str, Any] = {"engine": engine, "chunks": None, "cache": False}
    handle = None
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_CONSOLIDATED_WARNING)
            if engine == "zarr":
                if storage_options:
                    kwargs["storage_options"] = dict(storage_options)
                dataset = xr.open_dataset(local if local is not None else data, **kwargs)
            elif local is None:
                import fsspec  # a core dependency, imported on use

                handle = fsspec.open(data, mode="rb", **dict(storage_options or {})).open()
                dataset = xr.open_dataset(handle, **kwargs)
            else:
                dataset = xr.open_dataset(local, **kwargs)
    except (OSError, ValueError, KeyError) as exc:
        if handle is not None:
            handle.close()
        raise ConfigError(
            f"`data` could not be opened with engine={engine!r}. Received: data={data!r} "
            f"({type(exc).__name__}: {exc}). Check the path, or pass the right `engine`."
        ) from exc
    return Opened(dataset, source, engine, owned=True, handle=handle)
