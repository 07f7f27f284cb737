"""Cross-check `WellSource` against The Well's own reader (`the_well.data.WellDataset`).

Not a test of the suite: the_well 1.2.0 needs torch and pins fsspec, so it runs in an
environment of its own, built on the fly from the workspace root (uv.lock is untouched):

    uv run --no-project --with the-well==1.2.0 --with h5py --with-editable packages/core \\
        python scripts/well_crosscheck.py

It writes two directories of files: two files from the_well's own dummy-data writer
(`the_well.utils.dummy_data.write_dummy_data`: a `t1` field, a constant `t0` field,
constant and time-varying scalars) and two from `pipekit_train.core.testing.write_well_file`
(`t0`, `t1` and `t2` fields, chunked and contiguous, constant fields and scalars). For
each, and for several `(n_steps_input, n_steps_output, dt_stride)`, every window that
`WellDataset` serves (normalisation off) is compared, exactly, with the same window read
through `read_well` + `TrajectoryWindows`: the input and output fields, the constant
fields and scalars, the time-varying scalars and the time grid. Exits non-zero on the
first difference.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

CASES = ((1, 1, 1), (2, 3, 1), (1, 3, 2), (3, 1, 3))


def write_theirs(folder: Path) -> None:
    from the_well.utils.dummy_data import write_dummy_data

    np.random.seed(0)
    for i in range(2):
        write_dummy_data(str(folder / f"dummy_{i}.hdf5"))


def write_ours(folder: Path) -> None:
    from pipekit_train.core.testing import write_well_file

    rng = np.random.default_rng(0)
    n, t, h, w = 3, 11, 8, 6
    for i in range(2):
        fields = {
            "density": rng.normal(size=(n, t, h, w)).astype(np.float32),
            "pressure": rng.normal(size=(n, t, h, w)).astype(np.float32),
            "velocity": rng.normal(size=(n, t, h, w, 2)).astype(np.float32),
            "stress": rng.normal(size=(n, t, h, w, 2, 2)).astype(np.float32),
            "obstacle": rng.normal(size=(n, h, w)).astype(np.float32),
        }
        write_well_file(
            folder / f"ours_{i}.hdf5",
            fields=fields,
            scalars={
                "reynolds": np.float32(100.0),
                "drive": rng.normal(size=(n, t)).astype(np.float32),
            },
            constant=("obstacle", "reynolds"),
            shared=("reynolds",),
            time=np.arange(t, dtype=np.float32) * 0.25,
            n_spatial_dims=2,
            chunks={"velocity": (1, 4, h, w, 2), "stress": (1, 1, h, w, 2, 2)},
            dataset_name="crosscheck",
        )


def check(folder: Path, n_in: int, n_out: int, dt: int) -> tuple[int, str]:
    from the_well.data import WellDataset

    from pipekit_train.core.data import Trajectories, TrajectoryWindows, WellSource

    theirs = WellDataset(
        path=str(folder),
        n_steps_input=n_in,
        n_steps_output=n_out,
        min_dt_stride=dt,
        max_dt_stride=dt,
        use_normalization=False,
        return_grid=True,
        boundary_return_type="padding",
    )
    files = sorted(str(p) for p in folder.glob("*.hdf5"))  # WellDataset sorts its files
    source = WellSource(files)
    trajs = Trajectories.from_source(source)
    windows = TrajectoryWindows(trajs, k=n_in + n_out - 1, step=dt, stack=True)
    assert len(windows) == len(theirs), (len(windows), len(theirs))
    const_fields = [k for k, s in trajs.static_spec.items() if len(s.shape) > 1]
    const_scalars = [k for k, s in trajs.static_spec.items() if len(s.shape) == 1]
    idx = np.arange(len(windows))
    batch = windows.get_batch(idx)
    states = np.concatenate([batch["x"][:, None], batch["y"]], axis=1)
    items, starts = windows.locate(idx)
    times = starts[:, None] + np.arange(n_in + n_out) * dt
    _, static, forcings = trajs.window(items, times)
    for i in idx:
        sample = {k: v.numpy() for k, v in theirs[int(i)].items()}
        np.testing.assert_array_equal(sample["input_fields"], states[i, :n_in], f"window {i}")
        np.testing.assert_array_equal(sample["output_fields"], states[i, n_in:], f"window {i}")
        if const_fields:
            ours = np.concatenate([static[k][i] for k in const_fields], axis=-1)
            np.testing.assert_array_equal(sample["constant_fields"], ours)
        if const_scalars:
            ours = np.concatenate([static[k][i] for k in const_scalars], axis=-1)
            np.testing.assert_array_equal(sample["constant_scalars"], ours)
        if forcings:
            ours = np.concatenate([forcings[k][i] for k in forcings], axis=-1)
            np.testing.assert_array_equal(sample["input_scalars"], ours[:n_in])
            np.testing.assert_array_equal(sample["output_scalars"], ours[n_in:])
        grid = source.time[times[i]] - source.time[times[i]].min()
        np.testing.assert_allclose(sample["input_time_grid"], grid[:n_in], rtol=0, atol=1e-6)
        np.testing.assert_allclose(sample["output_time_grid"], grid[n_in:], rtol=0, atol=1e-6)
    compared = (
        f"state {list(source.field_names)}, constant fields {const_fields}, "
        f"constant scalars {const_scalars}, time-varying scalars {list(forcings)}, time grid"
    )
    return len(idx), compared


def main() -> int:
    import the_well

    print(f"the_well {the_well.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, writer in (
            ("the_well dummy data", write_theirs),
            ("write_well_file", write_ours),
        ):
            folder = Path(tmp) / name.replace(" ", "_")
            folder.mkdir()
            writer(folder)
            for n_in, n_out, dt in CASES:
                count, compared = check(folder, n_in, n_out, dt)
                print(
                    f"{name}: n_steps_input={n_in}, n_steps_output={n_out}, dt_stride={dt}: "
                    f"{count} windows equal"
                )
            print(f"  compared: {compared}")
    print("OK: every window read by WellSource equals WellDataset's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
