"""Throughput of `XarraySource` over a local zarr store against a hand-written zarr reader.

    uv run python benchmarks/bench_xarray_reader.py            # a ~2 GB store (about 2 minutes)
    uv run python benchmarks/bench_xarray_reader.py --quick    # a ~200 MB store
    uv run python benchmarks/bench_xarray_reader.py --gb 0.5 --batches 8 --rounds 4

The store is weather-like and written once into a temporary directory (deleted at the
end): one trajectory of 6-hourly states on a 64 × 128 grid, `temperature` and `u` on 8
levels, `t2m` (the state: 17 channels), the forcing `toa` and the static `orography`;
one time step per chunk (zstd), as WeatherBench 2's stores are chunked. `--gb` sets its
size (the number of time steps), `--quick` makes it ~200 MB.

Measured in a child process (the store is in the OS page cache after writing it):

1. windows/s of `make_batches(TrajectoryWindows(read_xarray(store, ...), k=4),
   batch_size=32, shuffle=True)`: batches of 32 windows of 5 states with the forcing and
   the static, against a hand-written reader (zarr-python, no xarray: one
   `array[t0:t0 + 5]` per window and variable, stacked channels-last) of the SAME windows
   in the SAME order (the iterator's epoch order). The two take turns batch-group by
   batch-group (`--rounds` rounds of `--batches` batches each, the first of each side
   untimed); the rate is windows over the summed time. Target: ratio >= 0.9.
2. The peak resident memory of a second child that only reads `--batches * --rounds`
   batches through the library. Target: < 600 MB.

Rows follow the convention in `benchmarks/run_all.py`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from _shared import apply_quick, child_env, child_main, make_parser, run_child, write_rows
from _shared import row as row_of

HERE = Path(__file__).resolve().parent
LEVELS = (50, 100, 250, 300, 500, 700, 850, 1000)
LAT, LON = 64, 128
STATE = ("temperature", "u", "t2m")
K, BATCH, SEED = 4, 32, 0
#: Bytes of one time step: 8 + 8 + 1 state fields and the forcing, float32.
STEP_BYTES = (2 * len(LEVELS) + 2) * LAT * LON * 4
QUICK = {"gb": 0.2, "batches": 4, "rounds": 3}
TARGET_RATIO, TARGET_MB = 0.9, 600


# -- the store ---------------------------------------------------------------------------------
def write_store(path: Path, steps: int) -> float:
    """Write the store (see the module doc) in blocks of time steps; the seconds it took."""
    import xarray as xr

    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    lat = np.linspace(-88.0, 88.0, LAT)
    lon = np.arange(LON) * 360.0 / LON
    base = (np.sin(np.radians(lat))[:, None] * np.cos(np.radians(lon))[None, :]).astype("f4")
    block = 100
    for start in range(0, steps, block):
        n = min(block, steps - start)
        phase = np.cos(np.arange(start, start + n) * 0.1).astype("f4")[:, None, None, None]

        def field(channels: int, n: int = n, phase: np.ndarray = phase) -> np.ndarray:
            scale = np.arange(1, channels + 1, dtype="f4")[None, :, None, None]
            noise = rng.standard_normal((n, channels, LAT, LON), dtype="f4")
            return phase * base * scale + 0.1 * noise

        times = np.datetime64("1979-01-01") + np.arange(start, start + n) * np.timedelta64(6, "h")
        ds = xr.Dataset(
            {
                "temperature": (("time", "level", "lat", "lon"), field(len(LEVELS))),
                "u": (("time", "level", "lat", "lon"), field(len(LEVELS))),
                "t2m": (("time", "lat", "lon"), field(1)[:, 0]),
                "toa": (("time", "lat", "lon"), field(1)[:, 0]),
            },
            coords={"time": times, "level": list(LEVELS), "lat": lat, "lon": lon},
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # zarr: consolidated metadata is not in v3's spec
            if start == 0:
                ds["orography"] = (("lat", "lon"), base * 1000.0)
                encoding = {name: {"chunks": (1, *ds[name].shape[1:])} for name in (*STATE, "toa")}
                ds.to_zarr(path, mode="w", encoding=encoding, consolidated=True)
            else:
                ds.to_zarr(path, append_dim="time", consolidated=True)
    return time.perf_counter() - t0


# -- the two readers ---------------------------------------------------------------------------
def library_iterator(path: str) -> tuple[Any, Any]:
    """`(make_batches iterator, windows)` of the library path."""
    from pipekit_train.core.data import TrajectoryWindows, make_batches, read_xarray

    trajs = read_xarray(path, state=list(STATE), forcings="toa", static="orography")
    windows = TrajectoryWindows(trajs, k=K)
    return make_batches(windows, BATCH, seed=SEED, shuffle=True), windows


class HandReader:
    """Zarr-python directly: one `array[t0:t0 + k + 1]` per window and variable."""

    def __init__(self, path: str) -> None:
        import zarr

        group = zarr.open_group(path, mode="r")
        self.arrays = {name: group[name] for name in (*STATE, "toa")}
        self.orography = np.asarray(group["orography"][...])[..., None]
        self.channels = [len(LEVELS), len(LEVELS), 1]

    def batch(self, starts: np.ndarray) -> dict[str, np.ndarray]:
        b = len(starts)
        states = np.empty((b, K + 1, LAT, LON, sum(self.channels)), np.float32)
        toa = np.empty((b, K, LAT, LON, 1), np.float32)
        for row, t0 in enumerate(starts.tolist()):
            c = 0
            for name, channels in zip(STATE, self.channels, strict=True):
                block = self.arrays[name][t0 : t0 + K + 1]
                if block.ndim == 4:  # (time, level, lat, lon) -> channels-last
                    block = block.transpose(0, 2, 3, 1)
                else:
                    block = block[..., None]
                states[row, ..., c : c + channels] = block
                c += channels
            toa[row] = self.arrays["toa"][t0 : t0 + K][..., None]
        # the model's input as the library builds it (`ModelInputs`): the state, the
        # forcing at the window's time, the static field; each step's forcing apart
        orography = np.broadcast_to(self.orography[None], (b, *self.orography.shape))
        x = np.concatenate([states[:, 0], toa[:, 0], orography], axis=-1)
        return {"x": x, "y": states[:, 1:], "forcing": toa}


def epoch_starts(windows: Any, batches: int) -> list[np.ndarray]:
    """The start times of the first `batches` batches (over as many epochs as that takes),
    in the iterator's order (its epoch orders, the last partial batch of each dropped)."""
    from pipekit_train.core.data.batching._order import epoch_order

    per_epoch = len(windows) // BATCH
    out: list[np.ndarray] = []
    epoch = 0
    while len(out) < batches:
        order = epoch_order(windows, len(windows), SEED, epoch, True)
        _, starts = windows.locate(order[: per_epoch * BATCH])
        out += [starts[i * BATCH : (i + 1) * BATCH] for i in range(per_epoch)]
        epoch += 1
    return out[:batches]


# -- the children ------------------------------------------------------------------------------
def measure_timing(path: str, batches: int, rounds: int) -> dict[str, Any]:
    """Interleaved rounds of the two readers over the same windows (see the module doc)."""
    it, windows = library_iterator(path)
    hand = HandReader(path)
    starts = epoch_starts(windows, 1 + rounds * batches)
    first = next(it)  # untimed: the first batch of each side, checked equal
    reference = hand.batch(starts[0])
    for key, value in reference.items():
        if not np.array_equal(first[key], value):
            raise SystemExit(f"the two readers disagree on {key!r}")
    seconds = {"library": 0.0, "hand": 0.0}
    for r in range(rounds):
        group = starts[1 + r * batches : 1 + (r + 1) * batches]
        sides = ["library", "hand"] if r % 2 == 0 else ["hand", "library"]
        for side in sides:
            t0 = time.perf_counter()
            for s in group:
                batch = next(it) if side == "library" else hand.batch(s)
                assert batch["x"].shape[0] == BATCH
            seconds[side] += time.perf_counter() - t0
    count = rounds * batches * BATCH
    return {f"{side}_wps": count / s for side, s in seconds.items()}


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB: `VmHWM` (Linux; unlike `ru_maxrss` it
    does not carry the parent's peak over `fork` + `exec`), else `ru_maxrss`."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_memory(path: str, batches: int) -> dict[str, Any]:
    """Peak RSS (MB) of reading `batches` batches through the library."""
    it, _ = library_iterator(path)
    before = peak_rss_mb()
    for _ in range(batches):
        next(it)
    return {"peak_mb": peak_rss_mb(), "after_setup_mb": before}


def child(args: argparse.Namespace) -> int:
    if args.child == "timing":
        return child_main(lambda: measure_timing(args.store, args.batches, args.rounds))
    return child_main(lambda: measure_memory(args.store, args.batches * args.rounds))


# -- main --------------------------------------------------------------------------------------
def main() -> int:
    parser = make_parser(__doc__, quick_help="a ~200 MB store, 3 rounds of 4 batches")
    parser.add_argument("--gb", type=float, default=2.0, help="store size in GiB, uncompressed")
    parser.add_argument("--batches", type=int, default=8, help="batches per side per round")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds")
    parser.add_argument("--dir", default=None, help="where to write the store (a temp dir)")
    parser.add_argument("--child", choices=("timing", "memory"), help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    args = parser.parse_args()
    apply_quick(parser, args, QUICK)
    if args.child:
        return child(args)
    steps = max(K + 2, int(args.gb * 2**30 / STEP_BYTES))
    tmp = Path(tempfile.mkdtemp(prefix="bench_xarray_", dir=args.dir))
    store = tmp / "era.zarr"
    try:
        write_s = write_store(store, steps)
        size = sum(f.stat().st_size for f in store.rglob("*") if f.is_file())
        print(
            f"store: {steps} time steps x {len(LEVELS)} levels x {LAT} x {LON}, "
            f"{size / 1e9:.2f} GB on disk, one step per chunk, written in {write_s:.0f} s; "
            f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
        )
        base = [sys.executable, str(Path(__file__).resolve()), "--store", str(store)]
        flags = ["--batches", str(args.batches), "--rounds", str(args.rounds)]
        env = child_env()
        timing = run_child([*base, *flags, "--child", "timing"], env=env, timeout=1800, cwd=HERE)
        memory = run_child([*base, *flags, "--child", "memory"], env=env, timeout=1800, cwd=HERE)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = make_rows(timing, memory, size, args)
    if args.json:
        write_rows(args.json, rows)
    return 0 if "error" not in timing and "error" not in memory else 1


def make_rows(
    timing: dict[str, Any], memory: dict[str, Any], size: int, args: argparse.Namespace
) -> list[dict[str, Any]]:
    store = f"{size / 1e9:.2f} GB zarr, one step per chunk"
    case = f"make_batches(TrajectoryWindows(read_xarray), k={K}), batch {BATCH}, shuffled"
    rows: list[dict[str, Any]] = []
    if "error" in timing:
        print(f"timing failed: {timing['error']}")
        rows.append(
            row_of(
                "xarray_reader", case, "did not complete", None, "", ok=False, note=timing["error"]
            )
        )
    else:
        lib, hand = timing["library_wps"], timing["hand_wps"]
        ratio = lib / hand
        print(f"  XarraySource + make_batches   {lib:8.1f} windows/s   {ratio:.2f}x hand-written")
        print(f"  hand-written zarr reader      {hand:8.1f} windows/s")
        rows.append(
            row_of(
                "xarray_reader",
                case,
                f"windows/s; ratio: ÷ hand-written zarr-python reader, same windows and order "
                f"({args.rounds} interleaved rounds of {args.batches} batches)",
                lib,
                "windows/s",
                ratio=ratio,
                target=f">= {TARGET_RATIO}",
                ok=ratio >= TARGET_RATIO,
                digits=1,
                note=store,
            )
        )
        rows.append(
            row_of(
                "xarray_reader",
                "hand-written zarr reader (zarr-python, no xarray): the reference",
                "windows/s",
                hand,
                "windows/s",
                digits=1,
                note=store,
            )
        )
    if "error" in memory:
        print(f"memory child failed: {memory['error']}")
        rows.append(
            row_of(
                "xarray_reader",
                "peak RSS",
                "did not complete",
                None,
                "",
                ok=False,
                note=memory["error"],
            )
        )
    else:
        peak = memory["peak_mb"]
        print(
            f"  peak RSS of the reading process {peak:6.0f} MB "
            f"({memory['after_setup_mb']:.0f} MB after imports and setup)"
        )
        rows.append(
            row_of(
                "xarray_reader",
                f"{case}: the reading process alone",
                f"peak RSS over {args.rounds * args.batches} batches (VmHWM)",
                peak,
                "MB",
                target=f"< {TARGET_MB} MB",
                ok=peak < TARGET_MB,
                digits=0,
                note=store,
            )
        )
    return rows


if __name__ == "__main__":
    sys.exit(main())
