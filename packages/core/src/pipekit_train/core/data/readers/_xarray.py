"""`XarraySource`: trajectories read window by window from an xarray dataset (NetCDF, zarr).

Weather and climate data (ERA5, WeatherBench 2, CMIP output) are datasets of variables
on dims such as `time × level × lat × lon`. The source turns them into trajectories:

- the *state* is the chosen variables stacked as channels, channels-last: a variable
  on `(time, lat, lon)` gives one channel, one on `(time, level, lat, lon)` one channel
  per level (in coordinate order), labelled `name@<level>` in `channel_names`;
- *forcings* are other time-varying variables (inputs, not predicted), one value per
  time step; *static* inputs are variables without the time dim (orography, a land–sea
  mask), the same for every trajectory unless they have the sample dim;
- the trajectories run along `time_dim`: one trajectory, or one per index of
  `sample_dim` (ensemble members, simulations).

Nothing is loaded whole. Paths open lazily (`chunks=None`: xarray's lazily indexed
backend arrays, no dask), and a batch of windows reads, per variable, one contiguous
time slice per window (overlapping windows of one trajectory share one read), then
picks the window's states (`step`) in numpy. Static variables under 64 MB are read once
when the source is built; larger ones are read per batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipekit_train.core._checks import is_int
from pipekit_train.core._errors import ConfigError
from pipekit_train.core.data.datasets._dataset import ArraySpec, Batch
from pipekit_train.core.data.datasets._hashing import Hasher
from pipekit_train.core.data.trajectories._trajectories import Trajectories

from ._xarray_layout import VarLayout, infer_spatial_dims, layout, time_chunk, time_grid
from ._xarray_open import open_data

__all__ = ["XarraySource", "read_xarray"]

#: Static variables up to this size are read once, when the source is built.
STATIC_IN_MEMORY_BYTES = 64 * 2**20
#: An in-memory dataset (no path) up to this size is fingerprinted by its values.
HASH_VALUES_BYTES = 64 * 2**20
#: The shuffle window (in storage chunks) of `shuffle_window="auto"`.
AUTO_SHUFFLE_WINDOW = 16


def _names(field: str, value: Any) -> tuple[str, ...]:
    names = (value,) if isinstance(value, str) else value
    if not isinstance(names, Sequence) or not all(isinstance(v, str) and v for v in names):
        raise ConfigError(
            f"`{field}` must be a variable name or a sequence of them. Received: "
            f"{field}={value!r}. Use e.g. {field}=('temperature', 'geopotential')."
        )
    if len(set(names)) != len(names):
        raise ConfigError(
            f"`{field}` names a variable twice. Received: {field}={list(names)}. Name each once."
        )
    return tuple(names)


def _check_shuffle_window(value: Any) -> int | str | None:
    if value is None or value == "auto":
        return None if value is None else "auto"
    if not is_int(value) or value < 1:
        raise ConfigError(
            "`shuffle_window` must be 'auto', None or a positive number of storage chunks. "
            f"Received: shuffle_window={value!r}."
        )
    return int(value)


@dataclass
class _Read:
    """One read of a variable: trajectory `sample` at `time`, and the rows it serves."""

    sample: int
    time: slice | np.ndarray
    rows: list[int]
    picks: list[slice | np.ndarray]  # each row's states within the read block


def _pick(offsets: np.ndarray) -> slice | np.ndarray:
    """`offsets` as a slice when they step evenly (a view instead of a copy)."""
    if offsets.size == 1:
        return slice(int(offsets[0]), int(offsets[0]) + 1)
    step = int(offsets[1] - offsets[0])
    if step > 0 and np.all(np.diff(offsets) == step):
        return slice(int(offsets[0]), int(offsets[-1]) + 1, step)
    return offsets


def plan_reads(traj: np.ndarray, times: np.ndarray) -> list[_Read]:
    """The reads serving windows `(traj[b], times[b])`: one contiguous read per window,
    windows of one trajectory whose spans overlap or touch merged into one read.

    A merged read whose span holds more than twice the states it needs (sparse times,
    e.g. a large `step`) reads just those states (an integer index) instead.
    """
    lo, hi = times.min(axis=1), times.max(axis=1) + 1
    order = np.lexsort((lo, traj))
    groups: list[list[int]] = []
    end = -1
    for b in order.tolist():
        if groups and traj[b] == traj[groups[-1][0]] and lo[b] <= end:
            groups[-1].append(b)
            end = max(end, int(hi[b]))
        else:
            groups.append([b])
            end = int(hi[b])
    reads = []
    for rows in groups:
        start, stop = int(lo[rows].min()), int(hi[rows].max())
        needed = np.unique(times[rows])
        if stop - start <= 2 * needed.size:
            key: slice | np.ndarray = slice(start, stop)
            picks = [_pick(times[b] - start) for b in rows]
        else:
            key = needed
            picks = [_pick(np.searchsorted(needed, times[b])) for b in rows]
        reads.append(_Read(int(traj[rows[0]]), key, rows, picks))
    return reads


class XarraySource:
    """A trajectory source over an xarray dataset (NetCDF or zarr; see the module doc).

    Use it with `Trajectories.from_source(source)`, or call `read_xarray`, which does.

    Args:
        data: an `xarray.Dataset` (opened lazily by you, e.g.
            `xr.open_zarr(uri, chunks=None)`), or a path or fsspec URI: a zarr store (a
            directory, or a name ending in `.zarr`) or a NetCDF-4 file (`.nc`, read with
            h5netcdf).
        state: the variables that make the state, channels-last in this order (a
            variable with a level dim gives one channel per level).
        forcings: time-varying input variables (not predicted): item key = variable,
            one `(*spatial, channels)` value per time step (`(channels,)` for a variable
            without the spatial dims, e.g. a global CO2 concentration).
        static: variables without the time dim: item key = variable, one
            `(*spatial, channels)` value per trajectory.
        time_dim: the dim the trajectories run along.
        sample_dim: the dim indexing trajectories (ensemble members, simulations);
            None: the dataset is one trajectory.
        spatial_dims: the grid's dims, in the state's order; every state variable must
            have them (other dims become channels). None: those of the first state
            variable other than time, sample and vertical dims (named like
            `level`/`plev`/`pressure_level`/`height`/..., or a coordinate with the CF
            attribute `axis="Z"` or `positive`).
        shuffle_window: the chunk-aware shuffle declared to `make_batches` (see
            `chunk_states`): `"auto"`, None (always a full permutation) or a number of
            storage chunks per shuffle window.
        engine: the xarray engine for a path (default: from the name).
        storage_options: fsspec options for a remote URI.

    Attributes:
        dataset: the opened `xarray.Dataset`.
        source: the path or URI read (None for an in-memory dataset without one).
        n: the number of trajectories; `length`: states per trajectory.
        channel_names: one label per state channel (`temperature@500`, `t2m`).
        extra_channel_names: the channel labels of each static and forcing key.
        spatial_dims: the grid's dims; `time`: the time coordinate; `dt`: its step.

    Raises:
        ConfigError: a name the dataset lacks, a state or forcing variable without the
            time dim (or a static one with it), spatial dims that disagree, a missing
            time or sample dim, a non-uniform time grid, a non-numeric variable, or
            unusable options; all before any value is read.

    Examples:
        >>> import numpy as np, xarray as xr
        >>> from pipekit_train.core.data import XarraySource
        >>> ds = xr.Dataset(
        ...     {"t": (("time", "level", "lat", "lon"), np.zeros((10, 2, 4, 8), "f4")),
        ...      "t2m": (("time", "lat", "lon"), np.zeros((10, 4, 8), "f4"))},
        ...     coords={"time": np.arange(10), "level": [500, 850]})
        >>> source = XarraySource(ds, state=["t", "t2m"])
        >>> source.n, source.length, source.spec()[0].shape, source.channel_names
        (1, 10, (4, 8, 3), ('t@500', 't@850', 't2m'))
    """

    def __init__(
        self,
        data: Any,
        *,
        state: Sequence[str] | str,
        forcings: Sequence[str] | str = (),
        static: Sequence[str] | str = (),
        time_dim: str = "time",
        sample_dim: str | None = None,
        spatial_dims: Sequence[str] | None = None,
        shuffle_window: int | str | None = "auto",
        engine: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        groups = {
            "state": _names("state", state),
            "forcings": _names("forcings", forcings),
            "static": _names("static", static),
        }
        if not groups["state"]:
            raise ConfigError(
                "`state` must name at least one variable. Received: state=(). "
                "Use e.g. state=('temperature',)."
            )
        seen: dict[str, str] = {}
        for field, names in groups.items():
            for name in names:
                if name in seen:
                    raise ConfigError(
                        f"A variable can be in one of state, forcings and static. Received: "
                        f"{name!r} in both `{seen[name]}` and `{field}`. Keep it in one."
                    )
                seen[name] = field
        for field, dim in (("time_dim", time_dim), ("sample_dim", sample_dim)):
            if not (isinstance(dim, str) and dim) and not (field == "sample_dim" and dim is None):
                raise ConfigError(f"`{field}` must be a dim name. Received: {field}={dim!r}.")
        if sample_dim == time_dim:
            raise ConfigError(
                f"`sample_dim` and `time_dim` must differ. Received: both {time_dim!r}. "
                "Use sample_dim=None for a single trajectory along time."
            )
        self._shuffle_window = _check_shuffle_window(shuffle_window)
        self._opened = open_data(data, engine=engine, storage_options=storage_options)
        try:
            self._setup(groups, time_dim, sample_dim, spatial_dims)
        except BaseException:
            self._opened.close()
            raise

    # -- construction ------------------------------------------------------------------
    def _setup(
        self,
        groups: dict[str, tuple[str, ...]],
        time_dim: str,
        sample_dim: str | None,
        spatial_dims: Sequence[str] | None,
    ) -> None:
        ds = self._opened.dataset
        self.dataset, self.source = ds, self._opened.source
        self.time_dim, self.sample_dim = time_dim, sample_dim
        dims = [str(d) for d in ds.dims]
        for field, dim in (("time_dim", time_dim), ("sample_dim", sample_dim)):
            if dim is not None and dim not in ds.dims:
                raise ConfigError(
                    f"`{field}` names a dim the dataset lacks. Received: {field}={dim!r}; the "
                    f"dataset has dims {dims}. Pass one of them."
                )
        usable = [str(v) for v in ds.data_vars] + [str(c) for c in ds.coords if c not in ds.indexes]
        for field, names in groups.items():
            for name in names:
                if name not in usable:
                    raise ConfigError(
                        f"`{field}` names {name!r}, which the dataset lacks. Received: "
                        f"{field}={list(names)}; the data variables are "
                        f"{sorted(str(v) for v in ds.data_vars)}."
                    )
                var = ds[name]
                if var.dtype.kind not in "biuf":
                    raise ConfigError(
                        f"Every variable of `{field}` must be numeric. Received: {name!r} with "
                        f"dtype {var.dtype}. Drop it, or convert it (ds[{name!r}].astype(...))."
                    )
                timed = time_dim in var.dims
                if field == "static" and timed:
                    raise ConfigError(
                        f"A `static` variable has no time dim. Received: static variable "
                        f"{name!r} with dims {list(var.dims)}. Pass it as a forcing "
                        f"(forcings=[..., {name!r}]) if it varies in time."
                    )
                if field != "static" and not timed:
                    raise ConfigError(
                        f"A `{field}` variable needs the time dim {time_dim!r}. Received: "
                        f"{name!r} with dims {list(var.dims)}. "
                        + (
                            f"Pass it as static (static=[..., {name!r}]) if it does not "
                            "vary in time."
                            if field == "forcings"
                            else "Set `time_dim`, or move the variable to `static`."
                        )
                    )
                if field == "state" and sample_dim is not None and sample_dim not in var.dims:
                    raise ConfigError(
                        f"Every state variable needs the sample dim {sample_dim!r}. Received: "
                        f"{name!r} with dims {list(var.dims)}. Pass it as a forcing, or use "
                        "sample_dim=None."
                    )
        state = groups["state"]
        if spatial_dims is None:
            spatial = infer_spatial_dims(ds, state, time_dim, sample_dim)
        else:
            spatial = _names("spatial_dims", spatial_dims)
            bad = [d for d in spatial if d not in ds[state[0]].dims or d in (time_dim, sample_dim)]
            if bad:
                raise ConfigError(
                    f"`spatial_dims` must be dims of the state variable {state[0]!r} other than "
                    f"time and sample. Received: spatial_dims={list(spatial)}; {state[0]!r} has "
                    f"dims {list(ds[state[0]].dims)}."
                )
        self.spatial_dims: tuple[str, ...] = spatial

        def lay(field: str, name: str) -> VarLayout:
            return layout(
                ds,
                name,
                time_dim=time_dim,
                sample_dim=sample_dim,
                spatial=spatial,
                field=field,
                need_spatial=field == "state",
            )

        self._state = [lay("state", name) for name in state]
        self._forcings = {name: lay("forcings", name) for name in groups["forcings"]}
        self._static = {name: lay("static", name) for name in groups["static"]}
        self.time, self.dt = time_grid(ds, time_dim)
        self.n = int(ds.sizes[sample_dim]) if sample_dim is not None else 1
        self.length = int(ds.sizes[time_dim])
        self.channel_names: tuple[str, ...] = tuple(c for v in self._state for c in v.labels)
        self.extra_channel_names: dict[str, tuple[str, ...]] = {
            name: v.labels for name, v in {**self._static, **self._forcings}.items()
        }
        bounds = np.cumsum([0] + [v.channels for v in self._state])
        self._slices = [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        self._state_dtype = np.result_type(*(v.dtype for v in self._state))
        self._spatial_shape = self._state[0].spatial_shape
        self._variables = {name: ds.variables[name] for name in (*state, *self._forcings)}
        chunks = [time_chunk(ds, v.name, time_dim) for v in self._state]
        known = [c for c in chunks if c is not None]
        self.time_chunk: int | None = min(max(known), self.length) if known else None
        # The values read last, after every check: small statics now, once.
        self._static_values = {
            name: self._read_static(v, None)
            for name, v in self._static.items()
            if v.nbytes <= STATIC_IN_MEMORY_BYTES
        }

    def _read_static(self, v: VarLayout, samples: np.ndarray | None) -> np.ndarray:
        """Static variable `v` as `(*spatial, channels)`, or `(len(samples), ...)` when it
        has the sample dim (None: every sample, in one read)."""
        var = self.dataset.variables[v.name]
        if v.sample_dim is None:
            return v.arrange(np.asarray(var.values))
        if samples is None:
            whole = np.moveaxis(np.asarray(var.values), v.dims.index(v.sample_dim), 0)
            return np.stack([v.arrange(one) for one in whole])
        return np.stack([v.arrange(np.asarray(var[v.key(int(s), None)].values)) for s in samples])

    # -- the source protocol -----------------------------------------------------------
    def spec(self) -> tuple[ArraySpec, dict[str, ArraySpec], dict[str, ArraySpec]]:
        """`(state spec, static specs, forcing specs)` of one state / trajectory / step."""

        def shape(v: VarLayout) -> tuple[int, ...]:
            return (*v.spatial_shape, v.channels)

        return (
            ArraySpec((*self._spatial_shape, len(self.channel_names)), self._state_dtype),
            {k: ArraySpec(shape(v), v.dtype) for k, v in self._static.items()},
            {k: ArraySpec(shape(v), v.dtype) for k, v in self._forcings.items()},
        )

    def _fill(self, v: VarLayout, reads: list[_Read], out: np.ndarray) -> None:
        """Read variable `v` for each of `reads` into the rows of `out` they serve."""
        var = self._variables[v.name]
        for r in reads:
            block = v.arrange(np.asarray(var[v.key(r.sample, r.time)].values))
            for row, pick in zip(r.rows, r.picks, strict=True):
                out[row] = block[pick]

    def gather(self, traj: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, Batch, Batch]:
        """States `(B, L, *spatial, C)`, statics `{key: (B, ...)}` and forcings
        `{key: (B, L, ...)}` of trajectories `traj (B,)` at `times (B, L)`."""
        traj = np.asarray(traj, dtype=np.intp)
        times = np.asarray(times, dtype=np.intp)
        b, steps = times.shape
        reads = plan_reads(traj, times)
        shared: list[_Read] | None = None  # reads of variables without the sample dim

        def reads_for(v: VarLayout) -> list[_Read]:
            nonlocal shared
            if v.sample_dim is not None or self.n == 1:
                return reads
            if shared is None:
                shared = plan_reads(np.zeros_like(traj), times)
            return shared

        states = np.empty(
            (b, steps, *self._spatial_shape, len(self.channel_names)), self._state_dtype
        )
        for v, channels in zip(self._state, self._slices, strict=True):
            self._fill(v, reads, states[..., channels])  # a view: filled in place
        forcings: Batch = {}
        for name, v in self._forcings.items():
            forcings[name] = np.empty((b, steps, *v.spatial_shape, v.channels), v.dtype)
            self._fill(v, reads_for(v), forcings[name])
        static: Batch = {}
        for name, v in self._static.items():
            value = self._static_values.get(name)
            if value is None and v.sample_dim is not None:
                unique, inverse = np.unique(traj, return_inverse=True)
                static[name] = self._read_static(v, unique)[inverse]
                continue
            if value is None:
                value = self._read_static(v, None)
            if v.sample_dim is not None:
                static[name] = value[traj]
            else:
                static[name] = np.repeat(value[None], b, axis=0)
        return states, static, forcings

    def chunk_states(self) -> tuple[int, int] | None:
        """`(states per storage chunk, shuffle window in chunks)`, or None: a full shuffle.

        The rule: the storage chunk along time of the state variables (the largest,
        from the encoding's `preferred_chunks`, `chunks` (zarr) or `chunksizes`
        (NetCDF); at most the trajectory's length) holds that many states of one
        trajectory (trajectories are windowed one after another, so a chunk over several
        samples still counts one). `shuffle_window="auto"` declares 16 chunks per
        shuffle window when a chunk holds more than one state (neighbouring windows
        then share chunks, which a batch reads once) and None (a full permutation) when
        it holds one (every window reads its own chunks in any order) or the chunking
        is unknown (a contiguous NetCDF variable, an in-memory dataset). An int
        declares that window whenever the chunking is known; None never declares one.
        """
        window, chunk = self._shuffle_window, self.time_chunk
        if window is None or chunk is None:
            return None
        if window == "auto":
            return (chunk, AUTO_SHUFFLE_WINDOW) if chunk > 1 else None
        return chunk, int(window)

    def fingerprint(self, h: Hasher) -> None:
        """Hash the store's identity and the selection, or an in-memory dataset's content.

        Always: the path or URI (None for an in-memory dataset), the engine, the
        selection (state, forcings, static, time, sample and spatial dims) and each
        selected variable's dims, shape and dtype, and the time coordinate. A store's
        values are not read (a file rewritten in place keeps its fingerprint). A
        selected variable that lives in memory (no path, or built in memory: no
        encoding) adds its values when the in-memory selection totals at most 64 MB,
        else the coordinates of its dims and its attributes (deterministic, not a
        content hash).
        """
        ds = self.dataset
        layouts = [*self._state, *self._forcings.values(), *self._static.values()]
        h.update_json(
            {
                "xarray": {
                    "source": self.source,
                    "engine": self._opened.engine,
                    "state": [v.name for v in self._state],
                    "forcings": list(self._forcings),
                    "static": list(self._static),
                    "time_dim": self.time_dim,
                    "sample_dim": self.sample_dim,
                    "spatial_dims": list(self.spatial_dims),
                    "variables": {
                        v.name: [list(v.dims), list(ds[v.name].shape), v.dtype.str] for v in layouts
                    },
                }
            }
        )
        _hash_coordinate(h, self.time)
        in_memory = [v.name for v in layouts if self.source is None or not ds[v.name].encoding]
        if sum(ds[name].nbytes for name in in_memory) <= HASH_VALUES_BYTES:
            for name in in_memory:
                h.update_array(np.asarray(ds[name].values))
            return
        for name in in_memory:
            h.update_json({"coords_of": name, "attrs": dict(ds[name].attrs)})
            for dim in ds[name].dims:
                if dim in ds.indexes:
                    _hash_coordinate(h, np.asarray(ds.indexes[dim]))

    # -- the rest ------------------------------------------------------------------------
    def close(self) -> None:
        """Close the dataset when the source opened it (from a path or URI)."""
        self._opened.close()

    def __repr__(self) -> str:
        where = self.source or "in-memory dataset"
        return (
            f"XarraySource({where!r}, n={self.n}, T={self.length}, "
            f"state_shape={self.spec()[0].shape}, channels={len(self.channel_names)}, "
            f"static={list(self._static)}, forcings={list(self._forcings)})"
        )


def _hash_coordinate(h: Hasher, values: np.ndarray) -> None:
    values = np.asarray(values)
    if values.dtype.kind in "mM":  # no buffer: hash the nanosecond counts
        h.update_json(values.dtype.kind)
        h.update_array(
            values.astype("datetime64[ns]" if values.dtype.kind == "M" else "timedelta64[ns]").view(
                np.int64
            )
        )
    elif values.dtype.kind in "biufSU":
        h.update_array(values)
    else:
        h.update_json([str(v) for v in values.tolist()])


def read_xarray(
    data: Any,
    *,
    state: Sequence[str] | str,
    forcings: Sequence[str] | str = (),
    static: Sequence[str] | str = (),
    time_dim: str = "time",
    sample_dim: str | None = None,
    spatial_dims: Sequence[str] | None = None,
    shuffle_window: int | str | None = "auto",
    engine: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    state_key: str = "x",
) -> Trajectories:
    """`Trajectories` read from an xarray dataset, a zarr store or a NetCDF file.

    `Trajectories.from_source(XarraySource(data, ...), state_key=state_key)`: see
    `XarraySource` for the arguments. Cut training windows with `TrajectoryWindows`.

    Examples:
        >>> import numpy as np, xarray as xr
        >>> from pipekit_train.core.data import TrajectoryWindows, read_xarray
        >>> ds = xr.Dataset({"t2m": (("time", "lat", "lon"), np.zeros((10, 4, 8), "f4"))},
        ...                 coords={"time": np.arange(10)})
        >>> windows = TrajectoryWindows(read_xarray(ds, state="t2m"), k=2)
        >>> len(windows), windows[0]["y"].shape
        (8, (2, 4, 8, 1))
    """
    source = XarraySource(
        data,
        state=state,
        forcings=forcings,
        static=static,
        time_dim=time_dim,
        sample_dim=sample_dim,
        spatial_dims=spatial_dims,
        shuffle_window=shuffle_window,
        engine=engine,
        storage_options=storage_options,
    )
    return Trajectories.from_source(source, state_key=state_key)
