"""How `XarraySource` lays variables out as channels-last arrays, from metadata only.

Each variable's dims fall in four groups: the time dim, the sample dim (trajectories),
the spatial dims (shared by every state variable) and its *extra* dims (a level, a
band, ...), which become channels: one per combination, in coordinate order. Nothing
here reads a value: dims, sizes, dtypes, encodings and the (in-memory) index
coordinates are metadata.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError

__all__ = ["VarLayout", "infer_spatial_dims", "layout", "time_chunk", "time_grid"]

#: Dim names taken as a vertical (level-like) dim, i.e. channels, when inferring the
#: spatial dims. A coordinate with the CF attribute `axis="Z"` or `positive` is one too.
VERTICAL_NAMES = frozenset(
    {
        "level",
        "levels",
        "lev",
        "plev",
        "pressure",
        "pressure_level",
        "isobaricinhpa",
        "model_level",
        "hybrid",
        "height",
        "depth",
        "altitude",
    }
)


@dataclass(frozen=True)
class VarLayout:
    """One variable's place in a trajectory (see the module doc).

    Attributes:
        name: the variable.
        dims: its dims, in its order.
        time_dim: the time dim when it has one, else None.
        sample_dim: the sample dim when it has one, else None.
        spatial: the spatial dims when it has them (in the source's order), else ().
        spatial_shape: their sizes.
        channels: the number of channels (the product of the extra dims' sizes, or 1).
        labels: one label per channel: `name`, or `name@<coordinate value>` per extra dim.
        perm: the axes of a read block (the dims without the sample dim) in the order
            `(time, *spatial, *extra)`.
        dtype: the (decoded) dtype.
        nbytes: the variable's size in bytes.
    """

    name: str
    dims: tuple[str, ...]
    time_dim: str | None
    sample_dim: str | None
    spatial: tuple[str, ...]
    spatial_shape: tuple[int, ...]
    channels: int
    labels: tuple[str, ...]
    perm: tuple[int, ...]
    dtype: np.dtype
    nbytes: int

    def key(self, sample: int | None, time: Any) -> tuple[Any, ...]:
        """The index, in the variable's dims order, of trajectory `sample` at `time`."""
        out: list[Any] = []
        for dim in self.dims:
            if dim == self.sample_dim:
                out.append(sample)
            elif dim == self.time_dim:
                out.append(time)
            else:
                out.append(slice(None))
        return tuple(out)

    def arrange(self, block: np.ndarray) -> np.ndarray:
        """A read block (dims without the sample dim) as `([t,] *spatial, channels)`."""
        lead = (block.shape[self.perm[0]],) if self.time_dim is not None else ()
        out = np.transpose(block, self.perm)
        return out.reshape(lead + self.spatial_shape + (self.channels,))


def _label(value: Any) -> str:
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    if isinstance(value, (np.generic,)):
        return str(value.item())
    return str(value)


def _channel_labels(ds: Any, name: str, extra: Sequence[str]) -> tuple[str, ...]:
    if not extra:
        return (name,)
    axes = []
    for dim in extra:
        if dim in ds.indexes:
            axes.append([_label(v) for v in np.asarray(ds.indexes[dim])])
        else:
            axes.append([str(i) for i in range(ds.sizes[dim])])
    grid = np.array(np.meshgrid(*[np.arange(len(a)) for a in axes], indexing="ij"))
    combos = grid.reshape(len(axes), -1).T
    return tuple(name + "".join(f"@{axes[j][i]}" for j, i in enumerate(c)) for c in combos)


def is_vertical(ds: Any, dim: str) -> bool:
    """Whether `dim` reads as a vertical (level-like) dim (see `VERTICAL_NAMES`)."""
    if dim.lower() in VERTICAL_NAMES:
        return True
    if dim in ds.coords:
        attrs = ds.coords[dim].attrs
        return str(attrs.get("axis", "")).upper() == "Z" or "positive" in attrs
    return False


def infer_spatial_dims(
    ds: Any, state: Sequence[str], time_dim: str, sample_dim: str | None
) -> tuple[str, ...]:
    """The spatial dims: those of the first state variable other than time, sample and
    vertical (level-like) dims, in its order."""
    return tuple(
        str(d)
        for d in ds[state[0]].dims
        if d not in (time_dim, sample_dim) and not is_vertical(ds, str(d))
    )


def layout(
    ds: Any,
    name: str,
    *,
    time_dim: str,
    sample_dim: str | None,
    spatial: tuple[str, ...],
    field: str,
    need_spatial: bool,
) -> VarLayout:
    """The layout of variable `name` (a member of `field`: state, forcings or static).

    Raises:
        ConfigError: it has some but not all spatial dims (or none, when `need_spatial`).
    """
    var = ds[name]
    dims = tuple(str(d) for d in var.dims)
    has = [d for d in spatial if d in dims]
    if (has or need_spatial) and len(has) != len(spatial):
        raise ConfigError(
            f"Every variable of `{field}` must have the spatial dims {list(spatial)}"
            + ("" if need_spatial else " or none of them")
            + f". Received: {field} variable {name!r} with dims {list(dims)}. Select or "
            "rename dims so the variables share one grid (spatial dims are those of the "
            "first state variable, or pass `spatial_dims`)."
        )
    t = time_dim if time_dim in dims else None
    s = sample_dim if sample_dim is not None and sample_dim in dims else None
    space = spatial if has else ()
    extra = tuple(d for d in dims if d not in (t, s) and d not in space)
    block_dims = [d for d in dims if d != s]
    order = ([t] if t is not None else []) + list(space) + list(extra)
    channels = int(np.prod([ds.sizes[d] for d in extra], dtype=np.int64)) if extra else 1
    return VarLayout(
        name=name,
        dims=dims,
        time_dim=t,
        sample_dim=s,
        spatial=space,
        spatial_shape=tuple(int(ds.sizes[d]) for d in space),
        channels=channels,
        labels=_channel_labels(ds, name, extra),
        perm=tuple(block_dims.index(d) for d in order),
        dtype=np.dtype(var.dtype),
        nbytes=int(var.size) * np.dtype(var.dtype).itemsize,
    )


def _readable(delta: Any) -> str:
    if isinstance(delta, np.timedelta64):  # e.g. 6:00:00, 1 day, 0:00:00
        nanoseconds = int(delta.astype("timedelta64[ns]").astype(np.int64))
        return str(_dt.timedelta(microseconds=nanoseconds / 1000))
    return str(delta)


def time_grid(ds: Any, time_dim: str) -> tuple[np.ndarray, Any]:
    """`(times, dt)` of the time coordinate (in memory: an index), or `(arange, 1)`.

    Raises:
        ConfigError: a non-numeric, non-datetime time coordinate, or one whose steps
            are not all equal (the message names the worst gap).
    """
    length = int(ds.sizes[time_dim])
    if time_dim not in ds.indexes:
        return np.arange(length), 1
    times = np.asarray(ds.indexes[time_dim])
    if times.dtype.kind == "O" and length and isinstance(times[0], _dt.datetime | _dt.date):
        steps = np.array(
            [b - a for a, b in zip(times[:-1], times[1:], strict=True)], dtype="timedelta64[us]"
        )  # cftime dates of a model calendar (noleap, 360_day): their differences
    elif times.dtype.kind in "iufmM":
        steps = np.diff(times)
    else:
        raise ConfigError(
            f"The time coordinate must be numeric or datetime64. Received: `{time_dim}` "
            f"with dtype {times.dtype}. Decode it (xr.decode_cf) or pass `time_dim` of "
            "another dim."
        )
    if length < 2:
        return times, None
    dt: Any
    if steps.dtype.kind == "m":
        ints = steps.astype("timedelta64[ns]").astype(np.int64)
        ref = int(np.median(ints))
        dev = np.abs(ints - ref).astype(np.float64)
        tol, increasing = 0.0, ref > 0
        dt = np.timedelta64(ref, "ns").astype(steps.dtype)  # in the coordinate's unit
    else:
        ref_f = float(np.median(steps))
        dev = np.abs(steps.astype(np.float64) - ref_f)
        tol = 1e-6 * abs(ref_f)
        dt = steps.dtype.type(ref_f) if steps.dtype.kind in "iu" else ref_f
        increasing = ref_f > 0
    if not increasing:
        raise ConfigError(
            f"The time coordinate must increase. Received: `{time_dim}` from {times[0]} to "
            f"{times[-1]} (median step {_readable(dt)}). Sort it: ds.sortby({time_dim!r})."
        )
    worst = int(np.argmax(dev))
    if dev[worst] > tol:
        raise ConfigError(
            "Windows need a uniform time grid. Received: `"
            f"{time_dim}` steps by {_readable(dt)} mostly, but by {_readable(steps[worst])} "
            f"from {times[worst]} to {times[worst + 1]} (index {worst} to {worst + 1}). Select "
            f"a uniform part (ds.isel({time_dim}=slice(...))) or resample it."
        )
    return times, dt


def time_chunk(ds: Any, name: str, time_dim: str) -> int | None:
    """The storage chunk of variable `name` along time (from its encoding), or None."""
    var = ds[name]
    encoding = var.encoding
    preferred = encoding.get("preferred_chunks")
    if isinstance(preferred, dict) and isinstance(preferred.get(time_dim), int):
        return int(preferred[time_dim])
    for key in ("chunks", "chunksizes"):
        chunks = encoding.get(key)
        if isinstance(chunks, (tuple, list)) and len(chunks) == len(var.dims):
            value = chunks[list(var.dims).index(time_dim)]
            if isinstance(value, (int, np.integer)) and value > 0:
                return int(value)
    return None
