"""`WellSource` / `read_well`: trajectories read from The Well's HDF5 layout.

Every file here is tiny and written once per module with `write_well_file`; the
cross-check with the_well's own reader is `scripts/well_crosscheck.py` (an environment
of its own).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest

from pipekit_train.core import ConfigError
from pipekit_train.core.data import (
    Trajectories,
    TrajectoryWindows,
    WellSource,
    make_batches,
    read_well,
)
from pipekit_train.core.testing import write_well_file

h5py = pytest.importorskip("h5py")

T, H, W = 10, 4, 3


def _write(path: Path, n: int, seed: int, **extra: Any) -> dict[str, np.ndarray]:
    """A file of `n` trajectories (chunked along time): t0 `density`, t1 `velocity`, t2 `stress`,
    a constant `obstacle` field, a `mask` constant along y, a shared constant `nu`, a
    per-trajectory `amp`, a shared time-varying `drive`, per-trajectory `inflow` values."""
    rng = np.random.default_rng(seed)
    arrays = {
        "density": rng.normal(size=(n, T, H, W)).astype(np.float32),
        "velocity": rng.normal(size=(n, T, H, W, 2)).astype(np.float32),
        "stress": rng.normal(size=(n, T, H, W, 2, 2)).astype(np.float32),
        "obstacle": rng.normal(size=(n, H, W)).astype(np.float32),
        "mask": rng.normal(size=(n, T, H)).astype(np.float32),
        "nu": np.float32(0.01),
        "amp": rng.normal(size=n).astype(np.float32),
        "drive": rng.normal(size=T),
        "inflow": rng.normal(size=(n, T, 2)).astype(np.float32),
    }
    kwargs: dict[str, Any] = {
        "fields": {k: arrays[k] for k in ("density", "velocity", "stress", "obstacle", "mask")},
        "scalars": {k: arrays[k] for k in ("nu", "amp", "drive")},
        "boundary_values": {"inflow": arrays["inflow"]},
        "constant": ("obstacle", "nu", "amp"),
        "shared": ("nu", "drive"),
        "dim_varying": {"mask": (True, False)},
        "time": np.arange(T, dtype=np.float32) * 0.5,
        "n_spatial_dims": 2,
        "chunks": {
            "density": (1, 4, H, W),
            "mask": (1, 2, H),
            "velocity": (1, 4, H, W, 2),
            "stress": (1, 4, H, W, 2, 2),
        },
        "dataset_name": "tiny",
    }
    kwargs.update(extra)
    write_well_file(path, **kwargs)
    return arrays


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("well")
    a, b = root / "a.hdf5", root / "b.hdf5"
    return {"a": a, "b": b, "arrays_a": _write(a, 3, 0), "arrays_b": _write(b, 2, 1), "root": root}


def _h5_state(path: Path, traj: int, times: np.ndarray) -> np.ndarray:
    """The state read by plain h5py: density, mask (t0), velocity (t1), stress (t2)."""
    with h5py.File(path, "r") as f:
        lo, hi = int(times.min()), int(times.max())
        pick = times - lo
        density = f["t0_fields/density"][traj, lo : hi + 1][pick][..., None]
        velocity = f["t1_fields/velocity"][traj, lo : hi + 1][pick]
        stress = f["t2_fields/stress"][traj, lo : hi + 1][pick]
        mask = f["t0_fields/mask"][traj, lo : hi + 1][pick]
    stress = stress.reshape(*stress.shape[:3], 4)
    mask = np.broadcast_to(mask[:, :, None, None], (len(times), H, W, 1))
    return np.concatenate([density, mask, velocity, stress], axis=-1)


def _where(files: dict[str, Any], traj: int) -> tuple[Path, int]:
    return (files["a"], traj) if traj < 3 else (files["b"], traj - 3)


# -- what the windows hold ---------------------------------------------------------------
def test_every_window_equals_the_same_slice_read_by_h5py(files: dict[str, Any]) -> None:
    # the state alone (static inputs and forcings would join "x" as channels)
    trajs = read_well([files["a"], files["b"]], static=(), forcings=())
    assert len(trajs) == 5 and trajs.length == T and trajs.state_shape == (H, W, 8)
    windows = TrajectoryWindows(trajs, k=2, stride=1, step=2)
    idx = np.random.default_rng(0).permutation(len(windows))  # shuffled: runs get merged
    batch = windows.get_batch(idx)
    items, starts = windows.locate(idx)
    for row, (item, start) in enumerate(zip(items, starts, strict=True)):
        path, local = _where(files, int(item))
        expected = _h5_state(path, local, start + np.array([0, 2, 4]))
        np.testing.assert_array_equal(batch["x"][row], expected[0])
        np.testing.assert_array_equal(batch["y"][row], expected[1:])


def test_any_times_are_read_one_slice_per_window(files: dict[str, Any]) -> None:
    source = WellSource([files["a"], files["b"]])
    traj = np.array([4, 0, 0, 0, 3, 4])
    times = np.array([[7, 1, 9], [0, 1, 2], [1, 2, 3], [6, 8, 9], [2, 2, 2], [0, 5, 9]])
    states, _, forcings = source.gather(traj, times)
    for b in range(len(traj)):
        path, local = _where(files, int(traj[b]))
        np.testing.assert_array_equal(states[b], _h5_state(path, local, times[b]))
        inflow = files["arrays_b" if traj[b] >= 3 else "arrays_a"]["inflow"][local]
        np.testing.assert_array_equal(forcings["inflow"][b], inflow[times[b]])


def test_static_and_forcing_values(files: dict[str, Any]) -> None:
    source = WellSource([files["a"], files["b"]])
    _, static_spec, forcing_spec = source.spec()
    assert {k: s.shape for k, s in static_spec.items()} == {
        "obstacle": (H, W, 1),
        "nu": (1,),
        "amp": (1,),
    }
    assert {k: s.shape for k, s in forcing_spec.items()} == {"drive": (1,), "inflow": (2,)}
    assert forcing_spec["drive"].dtype == np.float64
    traj = np.array([1, 4, 1])
    times = np.array([[0, 1], [3, 4], [8, 9]])
    _, static, forcings = source.gather(traj, times)
    a, b = files["arrays_a"], files["arrays_b"]
    np.testing.assert_array_equal(static["obstacle"][0, ..., 0], a["obstacle"][1])
    np.testing.assert_array_equal(static["obstacle"][1, ..., 0], b["obstacle"][1])
    np.testing.assert_array_equal(static["nu"], np.full((3, 1), np.float32(0.01)))
    np.testing.assert_array_equal(static["amp"][:, 0], [a["amp"][1], b["amp"][1], a["amp"][1]])
    np.testing.assert_array_equal(forcings["drive"][0, :, 0], a["drive"][[0, 1]])
    np.testing.assert_array_equal(forcings["drive"][1, :, 0], b["drive"][[3, 4]])
    np.testing.assert_array_equal(forcings["inflow"][2], a["inflow"][1, [8, 9]])


def test_the_selection_sets_the_channels_and_extras(files: dict[str, Any]) -> None:
    source = WellSource(files["a"], fields=("velocity", "density"), static=(), forcings=("drive",))
    assert source.field_names == ("velocity_x", "velocity_y", "density")
    assert source.spec()[0].shape == (H, W, 3)
    assert source.spec()[1] == {} and list(source.spec()[2]) == ["drive"]
    states, static, _ = source.gather(np.array([2]), np.array([[5, 6]]))
    a = files["arrays_a"]
    np.testing.assert_array_equal(states[0, ..., :2], a["velocity"][2, 5:7])
    np.testing.assert_array_equal(states[0, ..., 2], a["density"][2, 5:7])
    assert static == {}
    every = WellSource(files["a"])
    assert every.field_names == (
        "density",
        "mask",
        "velocity_x",
        "velocity_y",
        "stress_xx",
        "stress_xy",
        "stress_yx",
        "stress_yy",
    )
    assert every.dataset_name == "tiny" and every.dt == 0.5 and every.n == 3
    np.testing.assert_array_equal(every.time, np.arange(T, dtype=np.float32) * 0.5)


def test_an_fsspec_uri_reads_the_same_windows(files: dict[str, Any]) -> None:
    memory = fsspec.filesystem("memory")
    memory.pipe("/well-test/a.hdf5", Path(files["a"]).read_bytes())
    try:
        remote = WellSource("memory://well-test/a.hdf5", storage_options={})
        local = WellSource(files["a"])
        traj, times = np.array([2, 0, 1]), np.array([[0, 1, 2], [7, 8, 9], [3, 5, 7]])
        for got, want in zip(remote.gather(traj, times), local.gather(traj, times), strict=True):
            if isinstance(got, dict):
                assert got.keys() == want.keys()
                for key in got:
                    np.testing.assert_array_equal(got[key], want[key])
            else:
                np.testing.assert_array_equal(got, want)
        assert remote.files == ("memory://well-test/a.hdf5",)
    finally:
        memory.rm("/well-test", recursive=True)


# -- batching ------------------------------------------------------------------------------
def test_shuffled_batches_resume_exactly(files: dict[str, Any]) -> None:
    windows = TrajectoryWindows(read_well([files["a"], files["b"]]), k=3, stride=1)
    assert windows.chunk_size == 4 and windows.shuffle_window == 16  # 4 steps a chunk
    it = make_batches(windows, 4, seed=3)
    for _ in range(2):
        next(it)
    state = it.get_state()
    assert state["order"].startswith("chunked:")
    ahead = [next(it) for _ in range(5)]
    again = make_batches(windows, 4, seed=3)
    again.set_state(state)
    for want in ahead:
        got = next(again)
        assert got.keys() == want.keys()
        for key in got:
            np.testing.assert_array_equal(got[key], want[key])


def test_chunk_states_follow_the_hdf5_chunks(tmp_path: Path) -> None:
    def layout(chunks: Any) -> tuple[int, int] | None:
        path = tmp_path / f"c{len(list(tmp_path.iterdir()))}.hdf5"
        write_well_file(
            path,
            fields={"u": np.zeros((4, T, H, W), np.float32)},
            time=np.arange(T, dtype=np.float32),
            n_spatial_dims=2,
            chunks={"u": chunks} if chunks else None,
        )
        return WellSource(path).chunk_states()

    assert layout(None) == (T, 16)  # contiguous: one trajectory per chunk
    assert layout((1, 3, H, W)) == (3, 16)  # part of a trajectory: its steps
    assert layout((2, T, H, W)) == (2 * T, 16)  # whole trajectories: all their states


# -- processes, pickle, fingerprints ---------------------------------------------------------
def test_a_forked_process_opens_its_own_files(files: dict[str, Any], tmp_path: Path) -> None:
    source = WellSource(files["a"])
    traj, times = np.array([0, 2]), np.array([[0, 1], [4, 5]])
    want = source.gather(traj, times)[0]  # the parent has opened the file
    parent_handles = source._handles
    out = tmp_path / "child.npy"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            got = source.gather(traj, times)[0]
            if source._handles is not parent_handles and source._handles.pid == os.getpid():
                np.save(out, got)
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    np.testing.assert_array_equal(np.load(out, allow_pickle=False), want)
    assert source._handles is parent_handles  # the parent keeps its files


def test_reading_never_unpickles(files: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("pickle used on a load path")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    windows = TrajectoryWindows(read_well([files["a"], files["b"]]), k=2)
    batch = next(make_batches(windows, 4, seed=0))
    assert batch["y"].shape == (4, 2, H, W, 8)


def test_construction_reads_no_field_data(
    files: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    read: list[str] = []
    original = h5py.Dataset.__getitem__

    def spy(self: Any, index: Any) -> Any:
        read.append(self.name)
        return original(self, index)

    monkeypatch.setattr(h5py.Dataset, "__getitem__", spy)
    WellSource([files["a"], files["b"]])
    assert read and all(name == "/dimensions/time" for name in read)


def test_the_fingerprint_names_files_and_selection(files: dict[str, Any], tmp_path: Path) -> None:
    both = read_well([files["a"], files["b"]])
    assert both.fingerprint() == read_well([str(files["a"]), files["b"]]).fingerprint()
    assert both.fingerprint() != read_well([files["b"], files["a"]]).fingerprint()
    assert both.fingerprint() != read_well([files["a"], files["b"]], static=()).fingerprint()
    copy = tmp_path / "a.hdf5"
    copy.write_bytes(Path(files["a"]).read_bytes())
    assert read_well(copy).fingerprint() != read_well(files["a"]).fingerprint()


def test_float32_time_rounding_is_a_uniform_grid(tmp_path: Path) -> None:
    steps = 1001
    path = write_well_file(
        tmp_path / "long.hdf5",
        fields={"u": np.zeros((1, steps, 2), np.float32)},
        time=np.arange(steps, dtype=np.float32) * np.float32(0.1),
        n_spatial_dims=1,
    )
    assert WellSource(path).dt == pytest.approx(0.1)


# -- bad input -------------------------------------------------------------------------------
def _bad_time(tmp_path: Path) -> Path:
    time = np.arange(T, dtype=np.float64)
    time[6] += 0.25
    path = tmp_path / "jitter.hdf5"
    _write(path, 1, 2, time=time)
    return path


def _other_grid(tmp_path: Path) -> Path:
    path = tmp_path / "coarse.hdf5"
    write_well_file(
        path,
        fields={"density": np.zeros((1, T, 2, 2), np.float32)},
        time=np.arange(T, dtype=np.float32) * 0.5,
        n_spatial_dims=2,
        dataset_name="tiny",
    )
    return path


@pytest.mark.parametrize(
    ("make", "kwargs", "needles"),
    [
        (
            None,
            {"fields": ("vorticity",)},
            ["vorticity", "time-varying fields", "constant scalars"],
        ),
        (None, {"fields": ("obstacle",)}, ["obstacle", "constant in time", "static"]),
        (None, {"fields": ("drive",)}, ["drive", "scalar", "forcings"]),
        (None, {"fields": ()}, ["fields", "at least one"]),
        (None, {"static": ("density",)}, ["density", "varies in time", "fields"]),
        (None, {"static": ("pressure",)}, ["pressure", "lacks"]),
        (None, {"forcings": ("velocity",)}, ["velocity", "field"]),
        (None, {"forcings": ("nu",)}, ["nu", "constant in time", "static"]),
        (_bad_time, {}, ["jitter.hdf5", "uniform time grid", "0.25", "step 5"]),
        (_other_grid, {}, ["coarse.hdf5", "grid (2, 2)", "(4, 3)"]),
    ],
)
def test_bad_input_is_refused_by_name(
    files: dict[str, Any], tmp_path: Path, make: Any, kwargs: dict[str, Any], needles: list[str]
) -> None:
    paths = [files["a"]] if make is None else [files["a"], make(tmp_path)]
    if make is _bad_time:
        paths = paths[1:]
    with pytest.raises(ConfigError) as info:
        WellSource(paths, **kwargs)
    for needle in needles:
        assert needle in str(info.value)


def test_no_files_or_a_missing_file_is_refused(files: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="at least one file"):
        WellSource([])
    with pytest.raises(ConfigError, match="nowhere.hdf5"):
        WellSource([files["a"], tmp_path / "nowhere.hdf5"])
    with pytest.raises(ConfigError, match="memory://absent/x.hdf5"):
        WellSource("memory://absent/x.hdf5")
    with pytest.raises(ConfigError, match="files"):
        WellSource(iter([files["a"]]))  # type: ignore[arg-type]  # the wrong type on purpose
    with pytest.raises(ConfigError, match="files"):
        WellSource([files["a"], 3])  # type: ignore[list-item]  # the wrong type on purpose


def test_it_is_a_trajectory_source(files: dict[str, Any]) -> None:
    trajs = Trajectories.from_source(WellSource(files["a"]), state_key="u")
    item = trajs[1]
    assert item["u"].shape == (T, H, W, 8) and item["inflow"].shape == (T, 2)
    assert not trajs.in_memory and trajs.chunk_states == (4, 16)
