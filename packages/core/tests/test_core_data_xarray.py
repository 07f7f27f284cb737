"""XarraySource: windows read from zarr and NetCDF equal xarray's own selection, reads
stay window-sized, bad input is refused before any value is read, and batches resume."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipekit_train.core import ConfigError
from pipekit_train.core.data import (
    Trajectories,
    TrajectoryWindows,
    XarraySource,
    make_batches,
    read_xarray,
)
from pipekit_train.core.data.datasets._hashing import Hasher

xr = pytest.importorskip("xarray")

T, L, Y, X, M = 40, 2, 8, 16, 3
LEVELS = [500, 850]
STATE = ["temperature", "t2m", "v10"]


def _dataset(members: bool) -> Any:
    """Tiny weather-like data; `v10` stores its grid as (lon, lat), the others (lat, lon)."""
    rng = np.random.default_rng(0)
    lead = (M,) if members else ()
    m = ("member",) if members else ()

    def field(*shape: int) -> np.ndarray:
        return rng.normal(size=lead + shape).astype(np.float32)

    data = {
        "temperature": (m + ("time", "level", "lat", "lon"), field(T, L, Y, X)),
        "t2m": (m + ("time", "lat", "lon"), field(T, Y, X)),
        "v10": (m + ("time", "lon", "lat"), field(T, X, Y)),
        "toa": (("time", "lat", "lon"), rng.normal(size=(T, Y, X)).astype(np.float32)),
        "co2": (("time",), np.linspace(400, 410, T)),
        "orography": (("lat", "lon"), rng.normal(size=(Y, X)).astype(np.float32)),
    }
    if members:
        data["param"] = (("member",), np.arange(M, dtype=np.float32) + 0.5)
    coords = {
        "time": np.datetime64("2000-01-01") + np.arange(T) * np.timedelta64(6, "h"),
        "level": LEVELS,
        "lat": np.linspace(-80, 80, Y),
        "lon": np.arange(X) * 22.5,
    }
    return xr.Dataset(data, coords=coords)


def _write(ds: Any, path: Path) -> str:
    timed = [n for n in ds.data_vars if "time" in ds[n].dims]
    if path.suffix == ".zarr":
        encoding = {
            n: {"chunks": tuple(4 if d == "time" else ds.sizes[d] for d in ds[n].dims)}
            for n in timed
        }
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # zarr: consolidated metadata is not in v3's spec
            ds.to_zarr(path, mode="w", encoding=encoding)
    else:
        encoding = {
            n: {"chunksizes": tuple(4 if d == "time" else ds.sizes[d] for d in ds[n].dims)}
            for n in timed
            if n != "co2"
        }
        ds.to_netcdf(path, engine="h5netcdf", encoding=encoding)
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("xarray")
    return {
        f"{kind}-{fmt}": _write(_dataset(kind == "ens"), root / f"{kind}.{fmt}")
        for kind in ("ens", "one")
        for fmt in ("zarr", "nc")
    }


def _expected(ds: Any, sample: int | None, times: np.ndarray, names: list[str]) -> np.ndarray:
    """The window by xarray itself: isel, then (time, lat, lon, extra...) stacked."""
    parts = []
    for name in names:
        da = ds[name].isel(time=times)
        if sample is not None and "member" in da.dims:
            da = da.isel(member=sample)
        grid = [d for d in ("lat", "lon") if d in da.dims]
        extra = [d for d in da.dims if d not in ("time", *grid)]
        values = da.transpose("time", *grid, *extra).values
        parts.append(values.reshape(len(times), *values.shape[1 : 1 + len(grid)], -1))
    return np.concatenate(parts, axis=-1)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, int]]]:
    """`(variable, bytes)` of every read of a backend array (zarr, h5netcdf)."""
    from xarray.backends.h5netcdf_ import H5NetCDFArrayWrapper
    from xarray.backends.zarr import ZarrArrayWrapper

    log: list[tuple[str, int]] = []
    for cls in (ZarrArrayWrapper, H5NetCDFArrayWrapper):
        original = cls.__getitem__

        def counted(self: Any, key: Any, _original: Any = original) -> Any:
            out = _original(self, key)
            name = getattr(self, "variable_name", None) or self._array.basename
            log.append((name, int(np.asarray(out).nbytes)))
            return out

        monkeypatch.setattr(cls, "__getitem__", counted)
    yield log


# -- windows equal xarray's selection --------------------------------------------------------


@pytest.mark.parametrize("fmt", ["zarr", "nc"])
@pytest.mark.parametrize("kind", ["ens", "one"])
def test_gather_equals_isel_of_the_same_windows(files: dict[str, str], fmt: str, kind: str) -> None:
    sample_dim = "member" if kind == "ens" else None
    static = ["orography", "param"] if kind == "ens" else ["orography"]
    source = XarraySource(
        files[f"{kind}-{fmt}"],
        state=STATE,
        forcings=["toa", "co2"],
        static=static,
        sample_dim=sample_dim,
    )
    ds = _dataset(kind == "ens")
    n = M if kind == "ens" else 1
    rng = np.random.default_rng(1)
    # step 1, step 2 (one slice read, subsampled), step 3 (sparse: an index read) and
    # overlapping windows of one trajectory (one merged read)
    for step in (1, 2, 3):
        traj = rng.integers(0, n, size=6)
        starts = rng.integers(0, T - 3 * step, size=6)
        starts[1], traj[1] = starts[0] + 1, traj[0]
        times = starts[:, None] + step * np.arange(4)[None, :]
        states, stat, forcings = source.gather(traj, times)
        assert states.shape == (6, 4, Y, X, 2 + 1 + 1) and states.dtype == np.float32
        for b in range(6):
            sample = int(traj[b]) if sample_dim else None
            np.testing.assert_array_equal(states[b], _expected(ds, sample, times[b], STATE))
            np.testing.assert_array_equal(
                forcings["toa"][b], ds["toa"].isel(time=times[b]).values[..., None]
            )
            np.testing.assert_array_equal(
                forcings["co2"][b], ds["co2"].isel(time=times[b]).values[:, None]
            )
            np.testing.assert_array_equal(stat["orography"][b], ds["orography"].values[..., None])
            if kind == "ens":
                assert stat["param"][b].tolist() == [traj[b] + 0.5]
    assert source.channel_names == ("temperature@500", "temperature@850", "t2m", "v10")
    assert source.n == n and source.length == T
    assert source.dt == np.timedelta64(6, "h") and source.time[0] == ds["time"].values[0]
    spec, static_spec, forcing_spec = source.spec()
    assert spec.shape == (Y, X, 4)
    assert static_spec["orography"].shape == (Y, X, 1)
    assert forcing_spec["toa"].shape == (Y, X, 1) and forcing_spec["co2"].shape == (1,)
    source.close()


@pytest.mark.parametrize("fmt", ["zarr", "nc"])
def test_windows_over_the_source_equal_xarray_windows(files: dict[str, str], fmt: str) -> None:
    trajs = read_xarray(
        files[f"ens-{fmt}"],
        state=STATE,
        forcings="toa",
        static="orography",
        sample_dim="member",
    )
    windows = TrajectoryWindows(trajs, k=3, stride=2, step=2)
    ds = _dataset(True)
    per = windows.windows_per_trajectory
    assert len(windows) == M * per
    idx = np.array([0, per - 1, per + 3, len(windows) - 1])
    batch = windows.get_batch(idx)
    for row, w in enumerate(idx):
        member, start = divmod(int(w), per)
        times = start * 2 + 2 * np.arange(4)
        full = _expected(ds, member, times, STATE)
        c = full.shape[-1]
        x, dtype = batch["x"][row], batch["x"].dtype
        # "x": the state, the forcing at the window's time, the static field (ModelInputs)
        np.testing.assert_array_equal(x[..., :c], full[0])
        toa = ds["toa"].isel(time=times[:-1]).values[..., None].astype(dtype)
        np.testing.assert_array_equal(x[..., c : c + 1], toa[0])
        orography = ds["orography"].values[..., None].astype(dtype)
        np.testing.assert_array_equal(x[..., c + 1 :], orography)
        np.testing.assert_array_equal(batch["y"][row], full[1:])
        np.testing.assert_array_equal(batch["forcing"][row], toa)
        np.testing.assert_array_equal(windows[int(w)]["y"], full[1:])


def test_make_batches_over_windows_resumes_exactly(files: dict[str, str]) -> None:
    trajs = read_xarray(files["ens-zarr"], state=STATE, forcings="toa", sample_dim="member")
    windows = TrajectoryWindows(trajs, k=2)
    it = make_batches(windows, 8, seed=3, shuffle=True)
    assert it.get_state()["order"] == "chunked:4x16"  # the zarr store's 4-step time chunks
    for _ in range(3):
        next(it)
    state = it.get_state()
    following = [next(it) for _ in range(4)]
    again = make_batches(windows, 8, seed=3, shuffle=True)
    again.set_state(state)
    for a, b in zip(following, [next(again) for _ in range(4)], strict=True):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


# -- reads stay window-sized -----------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["zarr", "nc"])
def test_reads_are_window_sized_never_whole_arrays(
    files: dict[str, str], fmt: str, reads: list[tuple[str, int]]
) -> None:
    source = XarraySource(files[f"one-{fmt}"], state=STATE, forcings="toa", static="orography")
    at_open = {name for name, _ in reads}
    assert at_open <= {"time", "level", "lat", "lon", "orography"}  # coordinates + the static
    reads.clear()
    traj = np.zeros(4, np.intp)
    times = np.array([20, 0, 33, 2])[:, None] + np.arange(5)[None, :]
    source.gather(traj, times)
    field = 4 * Y * X  # bytes of one float32 field
    per_state = {"temperature": L * field, "t2m": field, "v10": field, "toa": field}
    # one read per window and variable; the overlapping windows at 0 and 2 share one
    assert sorted(name for name, _ in reads) == sorted(list(per_state) * 3)
    for name in per_state:
        sizes = sorted(nbytes // per_state[name] for n, nbytes in reads if n == name)
        assert sizes == [5, 5, 7]  # states read: the windows' spans, never the 40 stored
    source.close()


def test_an_in_memory_dataset_is_read_window_by_window() -> None:
    ds = _dataset(False)
    source = XarraySource(ds, state=["temperature"])
    assert source.source is None and source.chunk_states() is None
    states, _, _ = source.gather(np.array([0]), np.array([[3, 4]]))
    np.testing.assert_array_equal(states[0], _expected(ds, None, np.array([3, 4]), ["temperature"]))


@pytest.mark.parametrize("fmt", ["zarr", "nc"])
def test_memory_fsspec_stores_read_like_local_ones(fmt: str) -> None:
    import fsspec

    ds = _dataset(False)
    uri = f"memory://pipekit-xarray-test/era.{fmt}"
    if fmt == "zarr":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds.to_zarr(uri, mode="w")
    else:  # a NetCDF file behind an fsspec URL is read through a file object
        fsspec.filesystem("memory").pipe(uri, bytes(ds.to_netcdf(engine="h5netcdf")))
    source = XarraySource(uri, state=["t2m"], static="orography")
    assert source.source == uri
    states, stat, _ = source.gather(np.array([0]), np.array([[7, 8, 9]]))
    np.testing.assert_array_equal(states[0], _expected(ds, None, np.array([7, 8, 9]), ["t2m"]))
    np.testing.assert_array_equal(stat["orography"][0, ..., 0], ds["orography"].values)
    source.close()


def test_large_statics_are_read_per_batch_with_the_same_values(
    files: dict[str, str], monkeypatch: pytest.MonkeyPatch, reads: list[tuple[str, int]]
) -> None:
    from pipekit_train.core.data.readers import _xarray

    def build() -> XarraySource:
        return XarraySource(
            files["ens-nc"], state="t2m", static=["orography", "param"], sample_dim="member"
        )

    traj, times = np.array([2, 0, 2]), np.array([[1, 2], [5, 6], [9, 10]])
    small = build().gather(traj, times)[1]
    monkeypatch.setattr(_xarray, "STATIC_IN_MEMORY_BYTES", 0)  # every static counts as large
    reads.clear()
    large = build()
    assert not [name for name, _ in reads if name in ("orography", "param")]  # none read yet
    for key in ("orography", "param"):
        np.testing.assert_array_equal(large.gather(traj, times)[1][key], small[key])


# -- per-channel statistics streamed along time ------------------------------------------------


def test_streamed_per_channel_moments_over_time_chunks_equal_numpy(files: dict[str, str]) -> None:
    """What a normaliser fit over one long trajectory needs: per-channel mean and std
    accumulated over chunks of states along time (Chan's update), never the whole array."""
    source = XarraySource(files["one-zarr"], state=STATE)
    trajs = Trajectories.from_source(source)
    count, mean, m2 = 0, np.zeros(4), np.zeros(4)
    for start in range(0, T, 7):  # 7 does not divide 40: a short last chunk
        times = np.arange(start, min(T, start + 7))[None]
        chunk = trajs.window(np.array([0]), times)[0].astype(np.float64)
        flat = chunk.reshape(-1, chunk.shape[-1])
        b, b_mean = flat.shape[0], flat.mean(axis=0)
        b_m2 = np.square(flat - b_mean).sum(axis=0)
        delta, total = b_mean - mean, count + b
        mean, m2 = mean + delta * b / total, m2 + b_m2 + delta**2 * count * b / total
        count = total
    whole = _expected(_dataset(False), None, np.arange(T), STATE).astype(np.float64)
    whole = whole.reshape(-1, 4)
    np.testing.assert_allclose(mean, whole.mean(axis=0), rtol=1e-10)
    np.testing.assert_allclose(np.sqrt(m2 / count), whole.std(axis=0), rtol=1e-10)


# -- layout, chunking and fingerprints ---------------------------------------------------------


def test_chunk_states_follow_the_time_chunking_and_the_shuffle_window(
    files: dict[str, str],
) -> None:
    def chunk_states(path: str, **kw: Any) -> Any:
        return XarraySource(path, state=STATE, sample_dim="member", **kw).chunk_states()

    assert chunk_states(files["ens-zarr"]) == (4, 16)
    assert chunk_states(files["ens-nc"]) == (4, 16)
    assert chunk_states(files["ens-zarr"], shuffle_window=8) == (4, 8)
    assert chunk_states(files["ens-zarr"], shuffle_window=None) is None
    ds = _dataset(True)
    ds["t2m"].encoding = {"preferred_chunks": {"time": 1}}
    single = XarraySource(ds, state="t2m", sample_dim="member")
    assert single.time_chunk == 1 and single.chunk_states() is None  # a state per chunk
    windows = TrajectoryWindows(read_xarray(files["ens-zarr"], state=STATE, sample_dim="member"))
    assert windows.chunk_size == 4 and windows.shuffle_window == 16


def test_level_dims_become_channels_and_spatial_dims_can_be_named() -> None:
    ds = _dataset(False)
    # `level` is a vertical dim by name even when every state variable has it
    source = XarraySource(ds.rename(level="plev"), state=["temperature"])
    assert source.spatial_dims == ("lat", "lon") and source.spec()[0].shape == (Y, X, L)
    assert source.channel_names == ("temperature@500", "temperature@850")
    grid = XarraySource(ds, state=["temperature"], spatial_dims=["level", "lat", "lon"])
    assert grid.spec()[0].shape == (L, Y, X, 1) and grid.channel_names == ("temperature",)


def _fingerprint(source: XarraySource) -> str:
    h = Hasher("test")
    source.fingerprint(h)
    return h.hexdigest()


def test_fingerprints_name_the_store_and_selection_or_hash_small_values(
    files: dict[str, str],
) -> None:
    path = files["one-zarr"]
    first = _fingerprint(XarraySource(path, state=STATE))
    assert _fingerprint(XarraySource(path, state=STATE)) == first
    assert _fingerprint(XarraySource(path, state=STATE[:2])) != first
    assert _fingerprint(XarraySource(files["one-nc"], state=STATE)) != first
    ds = _dataset(False)
    memory = _fingerprint(XarraySource(ds, state=STATE))
    assert _fingerprint(XarraySource(_dataset(False), state=STATE)) == memory
    changed = ds.copy(deep=True)
    changed["t2m"][0, 0, 0] = 99.0
    assert _fingerprint(XarraySource(changed, state=STATE)) != memory
    trajs = read_xarray(path, state=STATE)
    assert trajs.fingerprint() == read_xarray(path, state=STATE).fingerprint()


def test_big_in_memory_datasets_fall_back_to_coordinates(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipekit_train.core.data.readers import _xarray

    monkeypatch.setattr(_xarray, "HASH_VALUES_BYTES", 10)  # everything counts as big
    ds = _dataset(False)
    changed = ds.copy(deep=True)
    changed["t2m"][0, 0, 0] = 99.0
    a, b = (_fingerprint(XarraySource(d, state=STATE)) for d in (ds, changed))
    assert a == b  # values not hashed
    shifted = ds.assign_coords(lat=ds["lat"] + 1.0)
    assert _fingerprint(XarraySource(shifted, state=STATE)) != a


# -- bad input, refused before any value is read ----------------------------------------------


BAD: list[tuple[dict[str, Any], str]] = [
    ({"state": ["temperature", "humidity"]}, "`state` names 'humidity'"),
    ({"state": STATE, "static": ["lsm"]}, "`static` names 'lsm'"),
    ({"state": STATE, "forcings": ["toa", "t2m"]}, "'t2m' in both `state` and `forcings`"),
    ({"state": ["orography"]}, "A `state` variable needs the time dim 'time'"),
    ({"state": STATE, "static": ["toa"]}, "A `static` variable has no time dim"),
    ({"state": STATE, "forcings": ["orography"]}, "A `forcings` variable needs the time"),
    ({"state": STATE, "time_dim": "valid_time"}, "`time_dim` names a dim"),
    ({"state": STATE, "sample_dim": "ensemble"}, "`sample_dim` names a dim"),
    ({"state": STATE, "sample_dim": "time"}, "`sample_dim` and `time_dim` must differ"),
    ({"state": ["temperature", "co2"]}, "`state` must have the spatial dims ['lat', 'lon']"),
    ({"state": STATE, "spatial_dims": ["lat", "x"]}, "`spatial_dims`"),
    ({"state": []}, "`state` must name at least one"),
    ({"state": STATE, "shuffle_window": 0}, "`shuffle_window`"),
    ({"state": STATE, "engine": "zarr", "data": "memory"}, "`engine` and `storage_options`"),
]


@pytest.mark.parametrize(("kwargs", "match"), BAD)
def test_bad_input_is_refused_before_any_read(
    files: dict[str, str], reads: list[tuple[str, int]], kwargs: dict[str, Any], match: str
) -> None:
    kwargs = dict(kwargs)
    data = _dataset(False) if kwargs.pop("data", None) == "memory" else files["one-zarr"]
    with pytest.raises(ConfigError, match=re.escape(match)):
        XarraySource(data, **kwargs)
    assert {name for name, _ in reads} <= {"time", "level", "lat", "lon"}  # coordinates only


def test_a_missing_variable_lists_the_data_variables(files: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=r"the data variables are \['co2', 'orography', 't2m'"):
        XarraySource(files["one-nc"], state=["humidity"])


def test_a_non_uniform_time_grid_names_the_worst_gap() -> None:
    ds = _dataset(False)
    times = ds["time"].values.copy()
    times[25:] += np.timedelta64(6, "h")  # a missing step between index 24 and 25
    with pytest.raises(ConfigError, match=r"steps by 6:00:00 mostly, but by 12:00:00"):
        XarraySource(ds.assign_coords(time=times), state=STATE)
    with pytest.raises(ConfigError, match=r"index 24 to 25"):
        XarraySource(ds.assign_coords(time=times), state=STATE)
    numeric = ds.assign_coords(time=np.r_[np.arange(30) * 0.5, 20 + np.arange(10) * 0.5])
    with pytest.raises(ConfigError, match=r"by 0.5 mostly, but by 5.5"):
        XarraySource(numeric, state=STATE)
    uniform = ds.assign_coords(time=np.arange(T) * 0.1)
    assert XarraySource(uniform, state=STATE).dt == pytest.approx(0.1)


def test_non_numeric_variables_and_bad_paths_are_refused(tmp_path: Path) -> None:
    ds = _dataset(False)
    ds["station"] = (("time",), np.array(["a"] * T, dtype=object))
    with pytest.raises(ConfigError, match=r"`forcings` must be numeric.*'station'"):
        XarraySource(ds, state=STATE, forcings="station")
    with pytest.raises(ConfigError, match=r"`data` names no file"):
        XarraySource(tmp_path / "absent.zarr", state=STATE)
    with pytest.raises(ConfigError, match=r"`engine` is needed"):
        (tmp_path / "data.bin").write_bytes(b"")
        XarraySource(tmp_path / "data.bin", state=STATE)
    with pytest.raises(ConfigError, match=r"`storage_options` only apply to fsspec URLs"):
        XarraySource(tmp_path, state=STATE, storage_options={"anon": True})
    with pytest.raises(ConfigError, match=r"`data` must be an xarray.Dataset"):
        XarraySource(np.zeros(3), state=STATE)
