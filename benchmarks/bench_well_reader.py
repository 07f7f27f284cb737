"""Side-by-side benchmark of `WellSource`, the reader of The Well's HDF5 layout.

    uv run python benchmarks/bench_well_reader.py                # a 2 GB file (about a minute)
    uv run python benchmarks/bench_well_reader.py --quick        # a 200 MB file
    uv run python benchmarks/bench_well_reader.py --quick --json /tmp/well.json   # run_all

A file in The Well's layout is written once to a temporary directory on local disk
(`--size-mb`, default 2048; `--quick`: 200): 2-D, 128 x 128, a `t0` field `density` and
a `t1` field `velocity` (3 channels, float32, contiguous as the Well's own writer leaves
them), trajectories of 160 steps. Then, in a child process (its peak resident memory is
measured with `resource.getrusage`):

- A: `make_batches(TrajectoryWindows(Trajectories.from_source(WellSource(file)), k=4),
  32, shuffle=True)`, the library path (its chunk-aware shuffle over the file's layout);
- B: a hand-written h5py reader of the same windows in the same order (the order is the
  iterator's: `epoch_order`, the function `make_batches` uses): per window one slice
  per field, copied into its channels of a preallocated batch, and the model's input
  built as the library builds it (the state's channels, then the static `nu`).

Both read the first `--batches` batches of the epoch per round, in interleaved rounds
(A, B, A, B, ...) after one untimed round each; the rate is windows per second, the
median over `--rounds` rounds (the best is shown too), and the first batches of A and B
are checked to be equal. Targets: A reaches at least 0.9 of B's rate, and the child's
peak resident memory stays under 600 MB. The file is deleted at the end. The file sits
in the page cache once written (the machine's RAM permitting), so this measures the
readers, not the disk.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _shared import apply_quick, make_parser, write_rows
from _shared import row as row_of

BATCH, K, GRID, STEPS = 32, 4, 128, 160
QUICK = {"size_mb": 200, "rounds": 3, "batches": 15}
RATIO_TARGET, MEMORY_TARGET_MB = 0.9, 600


# -- the file -----------------------------------------------------------------------------
def write_file(path: Path, size_mb: int) -> tuple[int, int]:
    """Write a Well-layout file of about `size_mb` MB; `(n_traj, n_steps)`."""
    import h5py

    state = GRID * GRID * 3 * 4
    n_traj = max(2, round(size_mb * 2**20 / (state * STEPS)))
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f.attrs.update(
            {
                "dataset_name": "bench_well",
                "grid_type": "cartesian",
                "n_spatial_dims": 2,
                "n_trajectories": n_traj,
                "simulation_parameters": ["nu"],
                "nu": 0.01,
            }
        )
        dims = f.create_group("dimensions")
        dims.attrs["spatial_dims"] = ["x", "y"]
        dims.create_dataset("time", data=np.arange(STEPS, dtype=np.float32) * 0.5)
        dims["time"].attrs.update({"sample_varying": False, "time_varying": True})
        for axis in ("x", "y"):
            dims.create_dataset(axis, data=np.linspace(0, 1, GRID, dtype=np.float32))
            dims[axis].attrs.update({"sample_varying": False, "time_varying": False})
        f.create_group("boundary_conditions")
        scalars = f.create_group("scalars")
        scalars.attrs["field_names"] = ["nu"]
        scalars.create_dataset("nu", data=np.float32(0.01))
        scalars["nu"].attrs.update({"sample_varying": False, "time_varying": False})
        flags = {"dim_varying": [True, True], "sample_varying": True, "time_varying": True}
        shapes = {"t0_fields": ("density", ()), "t1_fields": ("velocity", (2,))}
        for group in ("t0_fields", "t1_fields", "t2_fields"):
            g = f.create_group(group)
            name, tail = shapes.get(group, (None, ()))
            g.attrs["field_names"] = [name] if name else []
            if name:
                ds = g.create_dataset(name, (n_traj, STEPS, GRID, GRID, *tail), np.float32)
                ds.attrs.update(flags)
                for i in range(n_traj):
                    ds[i] = rng.standard_normal((STEPS, GRID, GRID, *tail), dtype=np.float32)
    return n_traj, STEPS


# -- the child: both readers, interleaved ---------------------------------------------------
def child(path: str, rounds: int, batches: int) -> dict[str, Any]:
    import h5py

    from pipekit_train.core.data import Trajectories, TrajectoryWindows, WellSource, make_batches
    from pipekit_train.core.data.batching._order import epoch_order

    windows = TrajectoryWindows(Trajectories.from_source(WellSource(path)), k=K)
    order = epoch_order(windows, len(windows), 0, 0, True)[: batches * BATCH]
    per = windows.windows_per_trajectory
    f = h5py.File(path, "r")
    density, velocity = f["t0_fields/density"], f["t1_fields/velocity"]
    nu = np.float32(f["scalars/nu"][()])  # a static input: the model's input gains a channel

    def library(keep: int = 0) -> list[dict[str, np.ndarray]]:
        """Read the batches; return the first `keep` (the others are dropped at once)."""
        it = make_batches(windows, BATCH, seed=0, shuffle=True)
        kept = []
        for b in range(batches):
            batch = next(it)
            if b < keep:
                kept.append(batch)
        return kept

    def by_hand(keep: int = 0) -> list[dict[str, np.ndarray]]:
        kept = []
        for b in range(batches):
            states = np.empty((BATCH, K + 1, GRID, GRID, 3), np.float32)
            for i, w in enumerate(order[b * BATCH : (b + 1) * BATCH]):
                traj, start = divmod(int(w), per)
                span = slice(start, start + K + 1)
                states[i, ..., 0] = density[traj, span]
                states[i, ..., 1:] = velocity[traj, span]
            # the model's input (`ModelInputs`): the state, then the static `nu` as a channel
            x = np.empty((BATCH, GRID, GRID, 4), np.float32)
            x[..., :3] = states[:, 0]
            x[..., 3] = nu
            batch = {"x": x, "y": states[:, 1:]}
            if b < keep:
                kept.append(batch)
        return kept

    # the untimed rounds: the same windows in the same order
    for a, b in zip(library(keep=2), by_hand(keep=2), strict=True):
        np.testing.assert_array_equal(a["x"], b["x"])
        np.testing.assert_array_equal(a["y"], b["y"])
    times: dict[str, list[float]] = {"library": [], "hand": []}
    for _ in range(rounds):
        for name, fn in (("library", library), ("hand", by_hand)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    f.close()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {
        "windows": batches * BATCH,
        "times": times,
        "peak_rss_mb": rss_mb,
        "chunk_size": windows.chunk_size,
        "shuffle_window": windows.shuffle_window,
    }


def child_memory(path: str, batches: int) -> dict[str, Any]:
    """The peak resident memory of a process that reads with the library only."""
    from pipekit_train.core.data import Trajectories, TrajectoryWindows, WellSource, make_batches

    windows = TrajectoryWindows(Trajectories.from_source(WellSource(path)), k=K)
    it = make_batches(windows, BATCH, seed=0, shuffle=True)
    for _ in range(batches):
        next(it)
    return {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run_child(args: list[str]) -> dict[str, Any] | None:
    cmd = [sys.executable, __file__, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        print(proc.stdout + proc.stderr, file=sys.stderr)
        return None
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return result


def main() -> int:
    parser = make_parser(
        __doc__, quick_help="a 200 MB file, 3 rounds of 15 batches (explicit values win)"
    )
    parser.add_argument("--size-mb", type=int, default=2048, help="the file's size")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds per reader")
    parser.add_argument("--batches", type=int, default=40, help="batches per round")
    parser.add_argument("--child", metavar="PATH", help=argparse.SUPPRESS)
    parser.add_argument("--child-memory", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child or args.child_memory:
        result = (
            child(args.child, args.rounds, args.batches)
            if args.child
            else child_memory(args.child_memory, args.batches)
        )
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    apply_quick(parser, args, QUICK)
    tmp = Path(tempfile.mkdtemp(prefix="bench_well_"))
    try:
        path = tmp / "well.hdf5"
        t0 = time.perf_counter()
        n_traj, steps = write_file(path, args.size_mb)
        size_mb = path.stat().st_size / 2**20
        print(
            f"wrote {size_mb:.0f} MB ({n_traj} trajectories x {steps} steps x {GRID}x{GRID}x3 "
            f"float32, contiguous) in {time.perf_counter() - t0:.1f} s; {os.cpu_count()} CPUs, "
            f"load {os.getloadavg()[0]:.1f}"
        )
        counts = ["--rounds", str(args.rounds), "--batches", str(args.batches)]
        result = run_child(["--child", str(path), *counts])
        memory = run_child(["--child-memory", str(path), "--batches", str(args.batches)])
        if result is None or memory is None:
            return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    windows = result["windows"]
    rates = {k: [windows / t for t in v] for k, v in result["times"].items()}
    median = {k: statistics.median(v) for k, v in rates.items()}
    best = {k: max(v) for k, v in rates.items()}
    ratio = median["library"] / median["hand"]
    rss, rss_both = memory["peak_rss_mb"], result["peak_rss_mb"]
    case = (
        f"{size_mb:.0f} MB file, batch {BATCH} windows of k={K}, shuffled "
        f"(chunk-aware: {result['chunk_size']} windows x {result['shuffle_window']})"
    )
    metric = f"windows/s, median of {args.rounds} interleaved rounds of {args.batches} batches"
    print(f"{case}")
    print(
        f"  WellSource + make_batches: {median['library']:9,.0f} windows/s "
        f"(best {best['library']:,.0f})  ratio {ratio:.2f} (target >= {RATIO_TARGET})"
    )
    print(
        f"  hand-written h5py reader:  {median['hand']:9,.0f} windows/s (best {best['hand']:,.0f})"
    )
    print(
        f"  peak resident memory of a process reading with WellSource: {rss:.0f} MB "
        f"(target < {MEMORY_TARGET_MB}); of the process running both readers: {rss_both:.0f} MB"
    )
    rows = [
        row_of(
            "well_reader",
            f"hand-written h5py reader, {case}",
            metric,
            median["hand"],
            "windows/s",
            note="reference",
        ),
        row_of(
            "well_reader",
            f"WellSource + TrajectoryWindows + make_batches, {case}",
            metric,
            median["library"],
            "windows/s",
            ratio=ratio,
            target=f">= {RATIO_TARGET}",
            ok=ratio >= RATIO_TARGET,
            note="ratio: vs the hand-written h5py reader",
        ),
        row_of(
            "well_reader",
            f"peak resident memory of a process reading {args.batches} batches with WellSource",
            "MB (getrusage ru_maxrss)",
            rss,
            "MB",
            target=f"< {MEMORY_TARGET_MB}",
            ok=rss < MEMORY_TARGET_MB,
            digits=0,
            note=f"the process that ran both readers: {rss_both:.0f} MB",
        ),
    ]
    if args.json:
        write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
