"""`WellSource` and `read_well`: trajectories read from files in The Well's HDF5 layout.

The state is the channels of the chosen time-varying fields, channels-last,
`(*spatial, C)`: a `t0` field gives one channel, a `t1` field `D` (labelled like
`velocity_x`), a `t2` field `D * D` in C order (`stress_xy`), as `the_well`'s
`WellDataset` flattens them; a field that does not vary along a spatial axis is
repeated along it. Fields and scalars constant in time are static inputs; time-varying
scalars (and time-varying boundary values) are forcings. The layout itself is described
in `_well_layout`.

Reading: each window is one hyperslab per state field (`ds[traj, t0:t1 + 1]`, strided
when its times are evenly spaced, so a short window never reads its whole trajectory);
the windows of a batch are sorted by file and trajectory, and windows of one trajectory
whose spans overlap are read together. Files are opened on first use and kept open per
process; a process forked from one that opened them (a data-loader worker) opens its
own. Nothing is ever unpickled: the files are read with h5py only.

The chunk-aware shuffle (`chunk_states`): a storage chunk, in trajectory-major states,
is the HDF5 chunk of the state datasets: its length along time when it holds part of a
trajectory (the trajectories it also spans are not neighbours in a trajectory-major
order, so they are not counted), or its trajectories times `n_steps` when it holds
whole trajectories; a contiguous dataset counts one trajectory per chunk. The coarsest
state dataset wins, and the shuffle window is 16 chunks. Only the layout is declared,
so the order stays a pure function of `(seed, epoch)`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError
from pipekit_train.core._imports import optional_import
from pipekit_train.core.data.datasets._dataset import ArraySpec, Batch
from pipekit_train.core.data.datasets._hashing import Hasher
from pipekit_train.core.data.trajectories._trajectories import Trajectories

from ._well_layout import FileInfo, Quantity, describe, file_size, file_uri, open_file

__all__ = ["WellSource", "read_well"]

#: Shuffle chunks per window of the chunk-aware shuffle (`CachedDataset`'s default).
SHUFFLE_WINDOW = 16
#: Per-process bytes of static values and small forcing datasets kept in memory.
CACHE_BYTES = 64 * 2**20
#: A forcing dataset up to this size is read whole once per process, not per window.
SMALL_DATASET_BYTES = 8 * 2**20

Names = Sequence[str] | str | None


def _as_names(arg: str, value: Names) -> tuple[str, ...] | None:
    if value is None:
        return None
    items = (value,) if isinstance(value, str) else tuple(value)
    bad = [v for v in items if not isinstance(v, str)]
    if bad:
        raise ConfigError(
            f"`{arg}` must be None or a sequence of names. Received: {arg}={value!r}. "
            "Pass the names of the file's datasets, e.g. ('density', 'velocity')."
        )
    if len(set(items)) != len(items):
        raise ConfigError(f"`{arg}` names a quantity twice. Received: {arg}={list(items)}.")
    return items


def _catalogue(info: FileInfo) -> str:
    """The names of a file by kind, for error messages."""
    kinds: dict[str, list[str]] = {
        "time-varying fields": [],
        "constant fields": [],
        "time-varying scalars": [],
        "constant scalars": [],
        "time-varying boundary values": [],
    }
    for q in info.quantities.values():
        if q.kind == "boundary values":
            kinds["time-varying boundary values"].append(q.name)
        else:
            kinds[f"{'time-varying' if q.timed else 'constant'} {q.kind}s"].append(q.name)
    return "; ".join(f"{kind} {names}" for kind, names in kinds.items() if names) or "nothing"


def _select(info: FileInfo, arg: str, names: tuple[str, ...]) -> list[Quantity]:
    """The quantities `names` of `arg` ("fields", "static" or "forcings"), checked."""
    out = []
    for name in names:
        q = info.quantities.get(name)
        if q is None:
            raise ConfigError(
                f"`{arg}` names {name!r}, which {info.uri} lacks. Received: "
                f"{arg}={list(names)}. The file has {_catalogue(info)}."
            )
        hint = None
        if arg == "fields" and q.kind != "field":
            hint = f"it is a {q.kind}: pass it in `{'forcings' if q.timed else 'static'}`"
        elif arg == "fields" and not q.timed:
            hint = "it is constant in time: pass it in `static`"
        elif arg == "static" and q.timed:
            where = "fields" if q.kind == "field" else "forcings"
            hint = f"it varies in time: pass it in `{where}`"
        elif arg == "forcings" and q.kind == "field":
            hint = f"it is a field: pass it in `{'fields' if q.timed else 'static'}`"
        elif arg == "forcings" and not q.timed:
            hint = "it is constant in time: pass it in `static`"
        if hint:
            raise ConfigError(
                f"`{arg}` names {name!r}, which cannot be {arg}: {hint}. "
                f"Received: {arg}={list(names)}."
            )
        out.append(q)
    return out


def _compare(first: FileInfo, other: FileInfo, used: Sequence[str]) -> None:
    """ConfigError when `other` does not hold what `first` holds (grid, steps, names)."""
    differences = []
    for what, a, b in (
        ("dataset_name", first.dataset_name, other.dataset_name),
        ("spatial_dims", first.spatial_dims, other.spatial_dims),
        ("grid", first.spatial, other.spatial),
        ("n_steps", first.n_steps, other.n_steps),
    ):
        if a != b:
            differences.append(f"{what} {b!r} (the first file: {a!r})")
    if not differences and not np.isclose(other.dt, first.dt, rtol=1e-6, atol=0.0):
        differences.append(f"time step {other.dt:.6g} (the first file: {first.dt:.6g})")
    if not differences:
        names = (sorted(first.quantities), sorted(other.quantities))
        if names[0] != names[1]:
            differences.append(f"quantities {names[1]} (the first file: {names[0]})")
    if not differences:
        for name in used:
            ours, theirs = first.quantities[name], other.quantities[name]
            if ours.signature() != theirs.signature():
                differences.append(
                    f"{name!r} as {theirs.kind} of dtype {theirs.dtype}, sample_varying="
                    f"{theirs.sample}, time_varying={theirs.timed}, shape per step "
                    f"{theirs.broadcast} (the first file: {ours.kind} of dtype {ours.dtype}, "
                    f"{ours.sample}, {ours.timed}, {ours.broadcast})"
                )
    if differences:
        raise ConfigError(
            f"All files must hold the same quantities on the same grid. Received: {other.uri} "
            f"has {'; '.join(differences)}, unlike {first.uri}. Read the files apart, or "
            "leave this one out."
        )


class _Handles:
    """The open files of one process: `(h5py.File, fsspec file, {path: dataset})`."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.files: dict[int, tuple[Any, Any, dict[str, Any]]] = {}
        self.cache: dict[tuple[Any, ...], np.ndarray] = {}
        self.cache_bytes = 0

    def remember(self, key: tuple[Any, ...], value: np.ndarray) -> np.ndarray:
        """Keep `value` under `key` (the cache is emptied when it outgrows its budget)."""
        with self.lock:
            if self.cache_bytes + value.nbytes > CACHE_BYTES:
                self.cache.clear()
                self.cache_bytes = 0
            if value.nbytes <= CACHE_BYTES:
                self.cache[key] = value
                self.cache_bytes += value.nbytes
        return value


def _times_slice(times: np.ndarray) -> slice | None:
    """`slice(first, last + 1, step)` when `times` are evenly increasing, else None."""
    if times.size == 1:
        return slice(int(times[0]), int(times[0]) + 1)
    step = int(times[1] - times[0])
    if step > 0 and (times.size == 2 or bool((np.diff(times) == step).all())):
        return slice(int(times[0]), int(times[-1]) + 1, step)
    return None


class WellSource:
    """A trajectory source over files in The Well's HDF5 layout (see the module doc).

    Args:
        files: a path or fsspec URI (`memory://...`, `s3://...`), or a sequence of them;
            the trajectories of several files follow one another in the order given.
            The files must hold the same quantities on the same grid and time steps.
        fields: the time-varying fields whose channels make the state, in this order;
            None: every time-varying field, in file order (`t0`, `t1`, `t2`).
        static: the constant-in-time fields and scalars carried along per trajectory
            (a scalar as `(1,)`, a field as `(*spatial, components)`; a quantity that is
            not sample-varying is the same for every trajectory). None: all; `()`: none.
        forcings: the time-varying scalars (and time-varying boundary-condition
            `values`) carried along per time step, `(1,)` / `(n_values,)` per step.
            None: all; `()`: none.
        storage_options: keyword arguments of `fsspec.open` for URIs (credentials, ...).

    Attributes:
        n: the number of trajectories (over all files).
        length: the number of states per trajectory.
        time: the time grid of trajectory 0 (numpy).
        dt: the time step.
        field_names: one label per state channel, e.g. `("density", "velocity_x", ...)`.
        dataset_name: the files' `dataset_name`.
        spatial_dims: the names of the spatial axes.

    Raises:
        ConfigError: no files, a missing file or one not in the layout, files that
            differ, a name the files lack or that cannot play the asked part, or a
            non-uniform time grid. All before any field data is read.
        ImportError: h5py is not installed (`pip install 'pipekit-train-core[hdf5]'`).

    Examples:
        >>> from pipekit_train.core.data import TrajectoryWindows, WellSource, Trajectories
        >>> source = WellSource(["train/file_0.hdf5", "train/file_1.hdf5"])  # doctest: +SKIP
        >>> windows = TrajectoryWindows(Trajectories.from_source(source), k=4)  # doctest: +SKIP
    """

    def __init__(
        self,
        files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        fields: Names = None,
        static: Names = None,
        forcings: Names = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(files, (str, os.PathLike)):
            items: list[Any] = [files]
        elif isinstance(files, Sequence):
            items = list(files)
        else:
            raise ConfigError(
                "`files` must be a path or fsspec URI, or a sequence of them. Received: "
                f"files={files!r}. Pass e.g. sorted(glob('data/train/*.hdf5'))."
            )
        if not items:
            raise ConfigError(
                "`files` must name at least one file. Received: files=[]. Pass the paths "
                "of a Well dataset's files, e.g. sorted(glob('data/train/*.hdf5'))."
            )
        field_names, static_names, forcing_names = (
            _as_names("fields", fields),
            _as_names("static", static),
            _as_names("forcings", forcings),
        )
        options = dict(storage_options or {})
        optional_import("h5py", extra="hdf5", package="pipekit-train-core")
        located = [file_uri(item) for item in items]
        sizes = [file_size(uri, local, options) for uri, local in located]
        infos = []
        for (uri, local), size in zip(located, sizes, strict=True):
            f, fileobj = open_file(uri, local, options)
            try:
                infos.append(describe(uri, local, size, f))
            finally:
                f.close()
                if fileobj is not None:
                    fileobj.close()
        first = infos[0]
        quantities = list(first.quantities.values())
        if field_names is None:
            field_names = tuple(q.name for q in quantities if q.kind == "field" and q.timed)
            if not field_names:
                raise ConfigError(
                    f"A state needs a time-varying field, but {first.uri} has none. "
                    f"Received: fields=None. The file has {_catalogue(first)}."
                )
        if not field_names:
            raise ConfigError(
                "`fields` must name at least one time-varying field. Received: fields=[]. "
                f"{first.uri} has {_catalogue(first)}."
            )
        if static_names is None:
            static_names = tuple(
                q.name for q in quantities if q.kind != "boundary values" and not q.timed
            )
        if forcing_names is None:
            forcing_names = tuple(q.name for q in quantities if q.kind != "field" and q.timed)
        self._fields = _select(first, "fields", field_names)
        self._static = _select(first, "static", static_names)
        self._forcings = _select(first, "forcings", forcing_names)
        for info in infos[1:]:
            _compare(first, info, (*field_names, *static_names, *forcing_names))

        self._infos = infos
        self._options = options
        self._offsets = np.cumsum([0] + [info.n_traj for info in infos]).astype(np.int64)
        self.n = int(self._offsets[-1])
        self.length = first.n_steps
        self.time: np.ndarray = first.time
        self.dt: float = first.dt
        self.dataset_name: str = first.dataset_name
        self.spatial_dims: tuple[str, ...] = first.spatial_dims
        self.field_names: tuple[str, ...] = tuple(lab for q in self._fields for lab in q.labels)
        self._channels: list[tuple[Quantity, int, int]] = []
        start = 0
        for q in self._fields:
            self._channels.append((q, start, start + q.value[-1]))
            start += q.value[-1]
        self._state_spec = ArraySpec(
            (*first.spatial, start), np.result_type(*(q.dtype for q in self._fields))
        )
        self._handles = _Handles()

    # -- the files of this process -------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_handles"] = None  # open files stay with their process
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._handles = _Handles()

    def _process_handles(self) -> _Handles:
        handles = self._handles
        if handles.pid != os.getpid():  # forked: the parent's files are not ours
            handles = self._handles = _Handles()
        return handles

    def _dataset(self, file: int, path: str) -> Any:
        handles = self._process_handles()
        entry = handles.files.get(file)
        if entry is None:
            with handles.lock:
                entry = handles.files.get(file)
                if entry is None:
                    info = self._infos[file]
                    f, fileobj = open_file(info.uri, info.local, self._options)
                    entry = handles.files[file] = (f, fileobj, {})
        datasets = entry[2]
        ds = datasets.get(path)
        if ds is None:
            ds = datasets[path] = entry[0][path]
        return ds

    def _read(self, file: int, q: Quantity, traj: int, times: slice) -> np.ndarray:
        """`(steps, *broadcast)`: the quantity of one trajectory at a slice of times."""
        index = ((traj,) if q.sample else ()) + (times,)
        block = self._dataset(file, q.path)[index]
        return block.reshape(block.shape[0], *q.broadcast)

    def _whole(self, file: int, q: Quantity) -> np.ndarray:
        """A small dataset read whole, once per process: `([n_traj,] n_steps, *value)`."""
        key = ("whole", file, q.path)
        handles = self._process_handles()
        value = handles.cache.get(key)
        if value is None:
            raw = self._dataset(file, q.path)[()]
            value = handles.remember(
                key, np.asarray(raw).reshape(*raw.shape[: 1 + q.sample], *q.value)
            )
        return value

    def _static_value(self, file: int, traj: int, q: Quantity) -> np.ndarray:
        """One trajectory's value of a static quantity, `q.value`."""
        key = ("static", file, traj if q.sample else -1, q.path)
        handles = self._process_handles()
        value = handles.cache.get(key)
        if value is None:
            ds = self._dataset(file, q.path)
            raw = np.asarray(ds[traj] if q.sample else ds[()])
            value = np.broadcast_to(raw.reshape(q.broadcast), q.value).copy()
            value = handles.remember(key, value)
        return value

    # -- the source protocol ---------------------------------------------------------------
    def spec(self) -> tuple[ArraySpec, dict[str, ArraySpec], dict[str, ArraySpec]]:
        """`(state, {static key: spec}, {forcing key: spec per step})`."""
        return (
            self._state_spec,
            {q.name: ArraySpec(q.value, q.dtype) for q in self._static},
            {q.name: ArraySpec(q.value, q.dtype) for q in self._forcings},
        )

    def gather(self, traj: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, Batch, Batch]:
        """States and extras of trajectories `traj (B,)` at `times (B, L)`."""
        traj = np.asarray(traj, dtype=np.int64)
        times = np.asarray(times, dtype=np.int64)
        count, steps = times.shape
        if count and (times.min() < 0 or times.max() >= self.length):
            raise IndexError(f"times out of range for trajectories of {self.length} states")
        if count and (traj.min() < 0 or traj.max() >= self.n):
            raise IndexError(f"trajectory indices out of range for {self.n} trajectories")
        files = np.searchsorted(self._offsets, traj, side="right") - 1
        local = traj - self._offsets[files]
        spec = self._state_spec
        states = np.empty((count, steps, *spec.shape), spec.dtype)
        forcings = {q.name: np.empty((count, steps, *q.value), q.dtype) for q in self._forcings}
        small = [q for q in self._forcings if q.nbytes <= SMALL_DATASET_BYTES]
        large = [q for q in self._forcings if q.nbytes > SMALL_DATASET_BYTES]
        first, last = times.min(axis=1), times.max(axis=1)
        order = np.lexsort((first, local, files))
        i = 0
        while i < count:
            b = order[i]
            file, trajectory = int(files[b]), int(local[b])
            run, lo, hi, requested = [b], int(first[b]), int(last[b]), steps
            j = i + 1
            while j < count:
                c = order[j]
                if files[c] != file or local[c] != trajectory:
                    break
                new_hi = max(hi, int(last[c]))
                if new_hi - lo + 1 > requested + steps:  # reading the union would cost more
                    break
                run.append(c)
                hi, requested = new_hi, requested + steps
                j += 1
            self._read_run(file, trajectory, run, lo, hi, times, states, forcings, large)
            i = j
        for q in small:
            out = forcings[q.name]
            for file in np.unique(files):
                rows = np.flatnonzero(files == file)
                whole = self._whole(int(file), q)
                out[rows] = (
                    whole[local[rows, None], times[rows]] if q.sample else whole[times[rows]]
                )
        return states, self._gather_static(traj, files, local), forcings

    def _read_run(
        self,
        file: int,
        traj: int,
        run: list[int],
        lo: int,
        hi: int,
        times: np.ndarray,
        states: np.ndarray,
        forcings: dict[str, np.ndarray],
        large: list[Quantity],
    ) -> None:
        """Read windows `run` of one trajectory, whose times lie in `[lo, hi]`."""
        if len(run) == 1:
            b = run[0]
            window = _times_slice(times[b])
            span = window or slice(lo, hi + 1)
            pick = None if window is not None else times[b] - lo
            for q, c0, c1 in self._channels:
                block = self._read(file, q, traj, span)
                states[b, ..., c0:c1] = block if pick is None else block[pick]
            for q in large:
                block = self._read(file, q, traj, span)
                forcings[q.name][b] = block if pick is None else block[pick]
            return
        span = slice(lo, hi + 1)
        for q, c0, c1 in self._channels:
            block = self._read(file, q, traj, span)
            for b in run:
                states[b, ..., c0:c1] = block[times[b] - lo]
        for q in large:
            block = self._read(file, q, traj, span)
            for b in run:
                forcings[q.name][b] = block[times[b] - lo]

    def _gather_static(self, traj: np.ndarray, files: np.ndarray, local: np.ndarray) -> Batch:
        """`{key: (B, *value)}`: each trajectory's value read once (and kept, if small)."""
        unique, first, inverse = np.unique(traj, return_index=True, return_inverse=True)
        out: Batch = {}
        for q in self._static:
            values = np.empty((unique.size, *q.value), q.dtype)
            for k, i in enumerate(first):
                values[k] = self._static_value(int(files[i]), int(local[i]), q)
            out[q.name] = values[inverse.reshape(-1)]
        return out

    def chunk_states(self) -> tuple[int, int] | None:
        """`(states per storage chunk, shuffle window)`: see the module doc."""
        states = 1
        for info in self._infos:
            for q in self._fields:
                chunks = info.quantities[q.name].chunks
                if chunks is None:
                    size = self.length
                else:
                    along_time = chunks[int(q.sample)]
                    along_traj = chunks[0] if q.sample else 1
                    size = along_time if along_time < self.length else along_traj * self.length
                states = max(states, size)
        return states, SHUFFLE_WINDOW

    def fingerprint(self, h: Hasher) -> None:
        """The files (URI or absolute path, size) and the selection; not the data bytes."""
        h.update_json(
            {
                "well": [[info.uri, info.size] for info in self._infos],
                "fields": [q.name for q in self._fields],
                "static": [q.name for q in self._static],
                "forcings": [q.name for q in self._forcings],
            }
        )

    @property
    def files(self) -> tuple[str, ...]:
        """The files, as absolute paths or URIs, in trajectory order."""
        return tuple(info.uri for info in self._infos)

    def __repr__(self) -> str:
        return (
            f"WellSource({self.dataset_name!r}, files={len(self._infos)}, n={self.n}, "
            f"T={self.length}, state={self._state_spec.shape}, fields={list(self.field_names)}, "
            f"static={[q.name for q in self._static]}, forcings={[q.name for q in self._forcings]})"
        )


def read_well(
    files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    fields: Names = None,
    static: Names = None,
    forcings: Names = None,
    storage_options: Mapping[str, Any] | None = None,
    state_key: str = "x",
) -> Trajectories:
    """`Trajectories` read from files in The Well's HDF5 layout.

    `Trajectories.from_source(WellSource(files, ...), state_key=state_key)`; see
    `WellSource` for the arguments.

    Examples:
        >>> from pipekit_train.core.data import TrajectoryWindows, read_well
        >>> trajs = read_well("data/train/file_0.hdf5", fields=("velocity",))  # doctest: +SKIP
        >>> windows = TrajectoryWindows(trajs, k=4, stride=2)  # doctest: +SKIP
    """
    source = WellSource(
        files, fields=fields, static=static, forcings=forcings, storage_options=storage_options
    )
    return Trajectories.from_source(source, state_key=state_key)
