"""`write_well_file`: a small writer of The Well's HDF5 layout, for tests and examples.

It writes what `the_well.data.WellDataset` (the_well 1.2.0) reads and its format checker
accepts: root attributes, `dimensions` (time and one coordinate per spatial axis),
`boundary_conditions` (a periodic condition per spatial axis, plus optional groups whose
`values` vary), `scalars` and `t0_fields` / `t1_fields` / `t2_fields`. A dataset's shape
is `([n_traj,] [n_steps,] *spatial, [D] * order)`: the trajectory axis only when it is
sample-varying, the time axis only when it is time-varying, and a spatial axis only when
the field varies along it (`dim_varying`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError
from pipekit_train.core._imports import optional_import

__all__ = ["write_well_file"]

_AXES = ("x", "y", "z")


def _flags(name: str, constant: set[str], shared: set[str]) -> tuple[bool, bool]:
    """`(sample_varying, time_varying)` of `name`."""
    return name not in shared, name not in constant


def _lead(sample: bool, timed: bool, n_traj: int, n_steps: int) -> tuple[int, ...]:
    return (n_traj,) * sample + (n_steps,) * timed


def _put(group: Any, name: str, data: np.ndarray, attrs: Mapping[str, Any], chunks: Any) -> None:
    kwargs: dict[str, Any] = {}
    if chunks is not None and data.ndim > 0:
        kwargs["chunks"] = chunks
    dataset = group.create_dataset(name, data=data, **kwargs)
    for key, value in attrs.items():
        dataset.attrs[key] = value


def write_well_file(
    path: str | os.PathLike[str],
    *,
    fields: Mapping[str, Any],
    time: Any,
    n_spatial_dims: int,
    scalars: Mapping[str, Any] | None = None,
    boundary_values: Mapping[str, Any] | None = None,
    constant: Sequence[str] = (),
    shared: Sequence[str] = (),
    dim_varying: Mapping[str, Sequence[bool]] | None = None,
    dataset_name: str = "synthetic",
    coords: Mapping[str, Any] | None = None,
    chunks: Mapping[str, tuple[int, ...] | bool] | None = None,
) -> Path:
    """Write trajectories to an HDF5 file in The Well's layout.

    Every array is stored as given, so its shape must be the stored shape of The Well:
    `([n_traj,] [n_steps,] *spatial, [D] * order)`, with the trajectory axis unless the
    name is in `shared` and the time axis unless it is in `constant`. A field's tensor
    order (its group, `t0_fields` .. `t2_fields`) is read off its number of axes.

    Args:
        path: the file to write (overwritten).
        fields: name → array. Insertion order is the `field_names` order in each group.
        time: the time grid, `(n_steps,)`, or `(n_traj, n_steps)` for a grid per
            trajectory (sample-varying).
        n_spatial_dims: `D`, 1 to 3; the spatial axes are named `x`, `y`, `z`.
        scalars: name → value: `()` (or `(1,)`) for a constant shared scalar, else with
            the leading axes above.
        boundary_values: name → values of a boundary condition of type `open` on the
            first spatial axis, `(..., n)` with the leading axes above; its `mask` marks
            `n` points (at both ends of the axis).
        constant: names that do not vary in time (no time axis).
        shared: names that are the same for every trajectory (no trajectory axis).
        dim_varying: field name → one flag per spatial axis; a field omits the axes it
            does not vary along (default: it varies along all of them).
        dataset_name: the root attribute `dataset_name`.
        coords: spatial axis name → coordinates (default `linspace(0, 1, size)`).
        chunks: name → HDF5 chunk shape (or True for h5py's choice); the default is a
            contiguous dataset.

    Returns:
        The path written.

    Raises:
        ConfigError: an array whose shape does not fit the layout.
    """
    h5py = optional_import("h5py", extra="hdf5", package="pipekit-train-core")
    if n_spatial_dims not in (1, 2, 3):
        raise ConfigError(f"`n_spatial_dims` must be 1, 2 or 3. Received: {n_spatial_dims!r}.")
    t = np.asarray(time)
    if t.ndim not in (1, 2):
        raise ConfigError(f"`time` must be (n_steps,) or (n_traj, n_steps). Received: {t.shape}.")
    constant_set, shared_set = set(constant), set(shared)
    dim_varying = dict(dim_varying or {})
    chunks = dict(chunks or {})
    arrays = {name: np.asarray(value) for name, value in fields.items()}
    scalar_arrays = {name: np.asarray(value) for name, value in (scalars or {}).items()}
    n_steps = int(t.shape[-1])
    n_traj = int(t.shape[0]) if t.ndim == 2 else 0
    for name, value in arrays.items():
        if name not in shared_set:
            n_traj = n_traj or int(value.shape[0])
    if n_traj < 1:
        raise ConfigError("A Well file needs one sample-varying field to count trajectories.")
    dims = _AXES[:n_spatial_dims]
    full = next((n for n in arrays if all(dim_varying.get(n, (True,)))), None)
    if full is None:
        raise ConfigError("A Well file needs a field that varies along every spatial axis.")
    lead0 = len(_lead(*_flags(full, constant_set, shared_set), n_traj, n_steps))
    spatial = tuple(int(s) for s in arrays[full].shape[lead0 : lead0 + n_spatial_dims])
    grid = {
        d: np.linspace(0.0, 1.0, s, dtype=np.float32) for d, s in zip(dims, spatial, strict=True)
    }
    grid.update({d: np.asarray(c) for d, c in (coords or {}).items()})

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        params = [
            name
            for name, value in scalar_arrays.items()
            if name in constant_set and name in shared_set and value.size == 1
        ]
        f.attrs.update(
            {
                "dataset_name": dataset_name,
                "grid_type": "cartesian",
                "n_spatial_dims": n_spatial_dims,
                "n_trajectories": n_traj,
                "simulation_parameters": params,
            }
        )
        for name in params:
            f.attrs[name] = scalar_arrays[name].reshape(()).item()

        group = f.create_group("dimensions")
        group.attrs["spatial_dims"] = list(dims)
        _put(group, "time", t, {"sample_varying": t.ndim == 2, "time_varying": True}, None)
        for d in dims:
            _put(group, d, grid[d], {"sample_varying": False, "time_varying": False}, None)

        group = f.create_group("boundary_conditions")
        for d, size in zip(dims, spatial, strict=True):
            mask = np.zeros(size, dtype=bool)
            mask[[0, -1]] = True
            sub = group.create_group(f"{d}_periodic")
            sub.attrs.update(
                {
                    "associated_dims": [d],
                    "associated_fields": [],
                    "bc_type": "PERIODIC",
                    "sample_varying": False,
                    "time_varying": False,
                }
            )
            sub.create_dataset("mask", data=mask)
        for name, value in (boundary_values or {}).items():
            values = np.asarray(value)
            sample, timed = _flags(name, constant_set, shared_set)
            lead = _lead(sample, timed, n_traj, n_steps)
            n = int(values.shape[-1]) if values.ndim else 0
            if values.shape != (*lead, n) or not 0 < n <= spatial[0]:
                raise ConfigError(
                    f"`boundary_values[{name!r}]` must have shape {(*lead, 'n')} with "
                    f"0 < n <= {spatial[0]}. Received: {values.shape}."
                )
            mask = np.zeros(spatial[0], dtype=bool)
            mask[: n - n // 2] = True
            mask[spatial[0] - n // 2 :] = True
            sub = group.create_group(name)
            sub.attrs.update(
                {
                    "associated_dims": [dims[0]],
                    "associated_fields": [],
                    "bc_type": "OPEN",
                    "sample_varying": sample,
                    "time_varying": timed,
                }
            )
            sub.create_dataset("mask", data=mask)
            sub.create_dataset("values", data=values)

        group = f.create_group("scalars")
        group.attrs["field_names"] = list(scalar_arrays)
        for name, values in scalar_arrays.items():
            sample, timed = _flags(name, constant_set, shared_set)
            lead = _lead(sample, timed, n_traj, n_steps)
            if values.shape != lead and not (not lead and values.shape == (1,)):
                raise ConfigError(
                    f"`scalars[{name!r}]` must have shape {lead}. Received: {values.shape}."
                )
            flags = {"sample_varying": sample, "time_varying": timed}
            _put(group, name, values, flags, chunks.get(name))

        groups = [f.create_group(f"t{order}_fields") for order in range(3)]
        names: list[list[str]] = [[], [], []]
        for name, values in arrays.items():
            sample, timed = _flags(name, constant_set, shared_set)
            lead = _lead(sample, timed, n_traj, n_steps)
            varying = tuple(bool(v) for v in dim_varying.get(name, (True,) * n_spatial_dims))
            if len(varying) != n_spatial_dims:
                raise ConfigError(
                    f"`dim_varying[{name!r}]` needs one flag per spatial axis. "
                    f"Received: {list(varying)} for n_spatial_dims={n_spatial_dims}."
                )
            kept = tuple(s for s, v in zip(spatial, varying, strict=True) if v)
            order = values.ndim - len(lead) - len(kept)
            if order not in (0, 1, 2) or values.shape != (*lead, *kept, *(n_spatial_dims,) * order):
                raise ConfigError(
                    f"`fields[{name!r}]` must have shape (*{lead}, *{kept}, *[D]*order) with "
                    f"D={n_spatial_dims} and order 0, 1 or 2. Received: {values.shape}."
                )
            attrs: dict[str, Any] = {
                "dim_varying": list(varying),
                "sample_varying": sample,
                "time_varying": timed,
            }
            if order == 2:
                attrs.update({"symmetric": False, "antisymmetric": False})
            _put(groups[order], name, values, attrs, chunks.get(name))
            names[order].append(name)
        for group, listed in zip(groups, names, strict=True):
            group.attrs["field_names"] = listed
    return Path(path)
