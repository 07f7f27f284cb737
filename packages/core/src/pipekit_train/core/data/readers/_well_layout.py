"""The Well's HDF5 layout: what a file holds, read from its attributes and shapes only.

The layout (PolymathicAI/the_well, `docs/data_format.md`, checked against its reader
`the_well.data.WellDataset` and its format checker, the_well 1.2.0): one file holds
`n_trajectories` trajectories of `n_steps` states on one grid.

- root attributes: `dataset_name`, `n_spatial_dims`, `n_trajectories`, `grid_type`,
  `simulation_parameters`;
- `dimensions`: `time` (`(n_steps,)`, or `(n_traj, n_steps)` when sample-varying) and
  one coordinate dataset per name in its attribute `spatial_dims`;
- `scalars`, `t0_fields`, `t1_fields`, `t2_fields`: groups whose attribute `field_names`
  lists their datasets; a dataset's attributes `sample_varying` / `time_varying` say
  whether it has a leading trajectory axis and then a time axis; a field's `dim_varying`
  says along which spatial axes it varies (it omits the others), and a `t{k}` field ends
  with `k` tensor axes of size `D` (`(D, D)` or flattened `D * D` for `k = 2`);
- `boundary_conditions`: one group per condition (`bc_type`, `associated_dims`,
  `mask`, optional `values`, and `sample_varying` / `time_varying`). No Well reader uses
  `values`; time-varying `values` are described here with the same leading axes as any
  other dataset: `([n_traj,] n_steps, n_values)`.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError
from pipekit_train.core._imports import optional_import

__all__ = ["FIELD_GROUPS", "FileInfo", "Quantity", "describe", "file_size", "file_uri", "open_file"]

FIELD_GROUPS = ("t0_fields", "t1_fields", "t2_fields")
#: The time grid's steps may deviate from `dt` by this fraction of `dt` (or by the
#: rounding of the stored time values, if larger).
TIME_RTOL = 1e-6


@dataclass(frozen=True)
class Quantity:
    """One dataset of a file: a field, a scalar or boundary values."""

    name: str
    kind: str  # "field", "scalar" or "boundary values"
    path: str
    order: int
    sample: bool  # a leading trajectory axis
    timed: bool  # a time axis (after the trajectory axis)
    broadcast: tuple[int, ...]  # the value's shape with size 1 along omitted spatial axes
    value: tuple[int, ...]  # one trajectory's value at one time step
    dtype: np.dtype
    chunks: tuple[int, ...] | None
    nbytes: int
    labels: tuple[str, ...]

    def signature(self) -> tuple[Any, ...]:
        return (self.kind, self.order, self.sample, self.timed, self.broadcast, self.dtype.str)


@dataclass(frozen=True)
class FileInfo:
    uri: str
    local: bool
    size: int
    dataset_name: str
    n_traj: int
    n_steps: int
    spatial_dims: tuple[str, ...]
    spatial: tuple[int, ...]
    time: np.ndarray
    dt: float
    quantities: dict[str, Quantity]


def _names(value: Any) -> list[str]:
    """An attribute holding names (str, bytes, or an array of them) as a list of str."""
    if value is None:
        return []
    if isinstance(value, (str, bytes)):
        value = [value]
    return [v.decode() if isinstance(v, bytes) else str(v) for v in np.asarray(value).ravel()]


def _flag(attrs: Any, key: str) -> bool:
    return bool(np.asarray(attrs.get(key, False)).item())


def file_uri(item: Any) -> tuple[str, bool]:
    """`(uri, local)`: an absolute path for a local file, else the fsspec URI."""
    if not isinstance(item, (str, os.PathLike)):
        raise ConfigError(
            "`files` must be a path or fsspec URI, or a sequence of them. Received: an item "
            f"{item!r} of type {type(item).__name__}. Pass e.g. 'data/train/file_0.hdf5'."
        )
    text = os.fspath(item)
    if not isinstance(text, str):
        raise ConfigError(f"`files` paths must be text. Received: {item!r}.")
    if text.startswith("file://"):
        text = text[len("file://") :]
    if "://" in text or "::" in text:
        return text, False
    return os.path.abspath(text), True


def open_file(uri: str, local: bool, storage_options: Mapping[str, Any]) -> tuple[Any, Any]:
    """`(h5py.File, the fsspec file object or None)`, read-only."""
    h5py = optional_import("h5py", extra="hdf5", package="pipekit-train-core")
    if local:
        return h5py.File(uri, "r"), None
    import fsspec

    fileobj = fsspec.open(uri, "rb", **storage_options).open()
    return h5py.File(fileobj, "r"), fileobj


def file_size(uri: str, local: bool, storage_options: Mapping[str, Any]) -> int:
    """The size of the file in bytes; ConfigError when it does not exist."""
    if local:
        if not os.path.isfile(uri):
            raise ConfigError(
                f"`files` names a file that does not exist. Received: {uri!r}. "
                "Check the path (a directory of a Well dataset holds e.g. data/train/*.hdf5)."
            )
        return os.path.getsize(uri)
    import fsspec

    fs, path = fsspec.core.url_to_fs(uri, **storage_options)
    if not fs.isfile(path):
        raise ConfigError(
            f"`files` names a file that does not exist. Received: {uri!r}. Check the URI "
            "and the `storage_options` (credentials, endpoint)."
        )
    return int(fs.size(path))


def _uniform_dt(uri: str, times: np.ndarray, dtype: np.dtype) -> float:
    """The time step of a uniform grid (every trajectory's); ConfigError otherwise."""
    rows = times.reshape(-1, times.shape[-1])
    n = rows.shape[1]
    if n < 2:
        return 0.0
    dt = float(rows[0, -1] - rows[0, 0]) / (n - 1)
    deviation = np.abs(np.diff(rows, axis=1) - dt)
    worst = float(deviation.max())
    eps = float(np.finfo(dtype).eps) if dtype.kind == "f" else 0.0
    tol = max(TIME_RTOL * abs(dt), 4 * eps * float(np.abs(rows).max()))
    if dt <= 0 or worst > tol:
        traj, step = np.unravel_index(int(deviation.argmax()), deviation.shape)
        where = f" (trajectory {traj}, step {step})" if rows.shape[0] > 1 else f" (step {step})"
        raise ConfigError(
            "Windows need a uniform time grid. Received: "
            f"{uri} whose `dimensions/time` steps deviate from dt={dt:.6g} by up to "
            f"{worst:.3g}{where}, more than rtol {TIME_RTOL:g} of dt. Resample its "
            "trajectories onto a uniform time grid, or leave the file out."
        )
    return dt


def _field(uri: str, group: str, name: str, ds: Any, n_traj: int, info: dict[str, Any]) -> Quantity:
    order = FIELD_GROUPS.index(group)
    dims, spatial, n_steps = info["spatial_dims"], info["spatial"], info["n_steps"]
    d = len(dims)
    sample, timed = _flag(ds.attrs, "sample_varying"), _flag(ds.attrs, "time_varying")
    varying = tuple(bool(v) for v in np.asarray(ds.attrs.get("dim_varying", [True] * d)))
    if len(varying) != d:
        raise ConfigError(
            f"{uri}: `{group}/{name}` has dim_varying={list(varying)}, one flag per spatial "
            f"axis of {list(dims)} expected. The file does not follow The Well's layout."
        )
    lead = (n_traj,) * sample + (n_steps,) * timed
    kept = tuple(s for s, v in zip(spatial, varying, strict=True) if v)
    tail = tuple(ds.shape[len(lead) + len(kept) :])
    comps = d**order
    if tuple(ds.shape[: len(lead) + len(kept)]) != (*lead, *kept) or tail not in {
        (d,) * order,
        (comps,) if order else (),
    }:
        raise ConfigError(
            f"{uri}: `{group}/{name}` has shape {tuple(ds.shape)}, but its attributes "
            f"(sample_varying={sample}, time_varying={timed}, dim_varying={list(varying)}) "
            f"and the file ({n_traj} trajectories, {n_steps} steps, grid {spatial}) give "
            f"{(*lead, *kept, *(d,) * order)}. The file does not follow The Well's layout."
        )
    labels = tuple(
        f"{name}_{''.join(p)}" if order else name for p in itertools.product(dims, repeat=order)
    )
    return Quantity(
        name=name,
        kind="field",
        path=f"{group}/{name}",
        order=order,
        sample=sample,
        timed=timed,
        broadcast=(*(s if v else 1 for s, v in zip(spatial, varying, strict=True)), comps),
        value=(*spatial, comps),
        dtype=np.dtype(ds.dtype),
        chunks=None if ds.chunks is None else tuple(ds.chunks),
        nbytes=int(np.prod(ds.shape)) * ds.dtype.itemsize,
        labels=labels,
    )


def _other(uri: str, kind: str, path: str, ds: Any, attrs: Any, info: dict[str, Any]) -> Quantity:
    """A scalar (value `(1,)`) or boundary values (value `(n,)`)."""
    sample, timed = _flag(attrs, "sample_varying"), _flag(attrs, "time_varying")
    lead = (info["n_traj"],) * sample + (info["n_steps"],) * timed
    tail = tuple(ds.shape[len(lead) :])
    ok = tuple(ds.shape[: len(lead)]) == lead and (
        tail in {(), (1,)} if kind == "scalar" else len(tail) <= 1
    )
    if not ok:
        raise ConfigError(
            f"{uri}: `{path}` has shape {tuple(ds.shape)}, but its attributes "
            f"(sample_varying={sample}, time_varying={timed}) and the file "
            f"({info['n_traj']} trajectories, {info['n_steps']} steps) give {lead} "
            f"{'(or with a trailing 1)' if kind == 'scalar' else 'and one axis of values'}. "
            "The file does not follow The Well's layout."
        )
    value = (int(np.prod(tail)),)
    return Quantity(
        name=path.split("/")[-2 if kind == "boundary values" else -1],
        kind=kind,
        path=path,
        order=0,
        sample=sample,
        timed=timed,
        broadcast=value,
        value=value,
        dtype=np.dtype(ds.dtype),
        chunks=None if ds.chunks is None else tuple(ds.chunks),
        nbytes=int(np.prod(ds.shape)) * ds.dtype.itemsize,
        labels=(),
    )


def describe(uri: str, local: bool, size: int, f: Any) -> FileInfo:
    """What a file holds (attributes, shapes, the time grid): no field data is read."""
    missing = [g for g in ("dimensions", "scalars") if g not in f]
    if missing or not any(g in f for g in FIELD_GROUPS):
        raise ConfigError(
            f"`files` names {uri}, which is not a file of The Well's layout: it lacks the "
            f"group(s) {missing or list(FIELD_GROUPS)}. Received: groups {sorted(f.keys())}."
        )
    dims = f["dimensions"]
    spatial_dims = tuple(_names(dims.attrs.get("spatial_dims")))
    if "time" not in dims or any(d not in dims for d in spatial_dims):
        raise ConfigError(
            f"{uri}: `dimensions` must hold `time` and the coordinates {list(spatial_dims)} "
            f"(its `spatial_dims`). Received: {sorted(dims.keys())}."
        )
    time_ds = dims["time"]
    raw = np.asarray(time_ds[()])
    n_traj = int(np.asarray(f.attrs.get("n_trajectories", raw.shape[0] if raw.ndim > 1 else 0)))
    info: dict[str, Any] = {
        "spatial_dims": spatial_dims,
        "spatial": tuple(int(dims[d].shape[-1]) for d in spatial_dims),
        "n_steps": int(raw.shape[-1]),
        "n_traj": n_traj,
    }
    dt = _uniform_dt(uri, raw.astype(np.float64), np.dtype(raw.dtype))
    quantities: dict[str, Quantity] = {}

    def add(q: Quantity) -> None:
        if q.name in quantities:
            raise ConfigError(
                f"{uri} holds two quantities named {q.name!r} ({quantities[q.name].path} and "
                f"{q.path}); names must be unique to be chosen by name. Rename one."
            )
        quantities[q.name] = q

    for group in FIELD_GROUPS:
        if group in f:
            for name in _names(f[group].attrs.get("field_names")):
                if name not in f[group]:
                    raise ConfigError(f"{uri}: `{group}` lists {name!r} but holds no such dataset.")
                add(_field(uri, group, name, f[group][name], n_traj, info))
    scalars = f["scalars"]
    scalar_names = (
        _names(scalars.attrs["field_names"]) if "field_names" in scalars.attrs else list(scalars)
    )
    for name in scalar_names:
        ds = scalars[name]
        add(_other(uri, "scalar", f"scalars/{name}", ds, ds.attrs, info))
    if "boundary_conditions" in f:
        for name, bc in f["boundary_conditions"].items():
            if "values" in bc and _flag(bc.attrs, "time_varying"):
                path = f"boundary_conditions/{name}/values"
                add(_other(uri, "boundary values", path, bc["values"], bc.attrs, info))
    return FileInfo(
        uri=uri,
        local=local,
        size=size,
        dataset_name=(_names(f.attrs.get("dataset_name")) or [""])[0],
        n_traj=n_traj,
        n_steps=info["n_steps"],
        spatial_dims=spatial_dims,
        spatial=info["spatial"],
        time=raw.reshape(-1, raw.shape[-1])[0].copy(),
        dt=dt,
        quantities=quantities,
    )
