"""Side-by-side benchmark of the data layer (not part of the test run).

    uv run python benchmarks/bench_data.py                          # full run (about 30 s on 2 cores)
    uv run python benchmarks/bench_data.py --rows 200000 --epochs 3 --repeats 3
    uv run python benchmarks/bench_data.py --quick --json /tmp/data.json   # run_all convention

`--quick` keeps every case and the sizes of the datasets (`--rows`) but runs best of 3
rounds of 2 epochs and builds a 1000-item simulation cache. Explicit `--epochs`,
`--repeats` and `--sim-items` win over `--quick`.

1. `make_batches` over an in-memory `ArrayDataset` vs a plain numpy
   permutation-and-gather loop (batch 256, 8 float32 features + 1 target).
2. `make_batches` over a local `CachedDataset` (loaded in memory, and out-of-core
   with a chunk cache and the chunk-aware shuffle) vs the in-memory rate, with a
   naive per-batch zarr fancy-index read as reference.
3. `CachedDataset.build` of a `SimulationDataset` with a slow-ish simulator,
   `workers=2` vs serial (the bytes must be identical).

Each measurement is repeated and the best rate is kept; measurements that are
compared are interleaved in one run, so machine noise hits both sides alike.

Rows follow the convention in `benchmarks/run_all.py`. Each row's `ratio` is relative to
its section's reference, named in the metric: the hand-written numpy loops (1), the
in-memory engine rate (2, 2b), the serial build (3). The targets: out-of-core reading
(2b, no prefetch) reaches at least half the in-memory rate, and a parallel build writes
the same bytes as the serial one (a row per `mp_context`); the other rates have none.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _shared import apply_quick, make_parser, write_rows
from _shared import row as row_of

from pipekit_train.core.data import ArrayDataset, CachedDataset, SimulationDataset, make_batches

BATCH = 256
QUICK = {"epochs": 2, "repeats": 3, "sim_items": 1_000}


# -- a slow-ish simulator (module level so spawn workers can import it) ----------------
def oscillator(theta: np.ndarray) -> np.ndarray:
    """A damped oscillator integrated with 1600 explicit Euler steps (a few ms per call)."""
    omega, damping = 1.0 + abs(theta[0]), 0.1 + abs(theta[1]) * 0.1
    pos, vel, dt = 1.0, 0.0, 0.005
    out = np.empty(16, dtype=np.float32)
    for step in range(1600):
        acc = -(omega**2) * pos - 2 * damping * omega * vel
        vel += dt * acc
        pos += dt * vel
        if step % 100 == 0:
            out[step // 100] = pos
    return out


def prior(rng: np.random.Generator) -> np.ndarray:
    """Parameters of the oscillator."""
    return rng.normal(size=2).astype(np.float32)


class Unblocked(ArrayDataset):
    """An ArrayDataset without block gathering: one `get_batch` call per batch."""

    gather_block_rows = None


# -- measurements ----------------------------------------------------------------------
def best_rate(fn: Callable[[], int], repeats: int) -> float:
    """Best batches/s over `repeats` runs of `fn` (which returns the batches it made)."""
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        count = fn()
        best = max(best, count / (time.perf_counter() - t0))
    return best


def compare(fns: dict[str, Callable[[], int]], rounds: int) -> dict[str, float]:
    """Best rate of each function over `rounds` rounds that run them in turn.

    Alternating short runs exposes every contender to the same machine load.
    """
    rates = dict.fromkeys(fns, 0.0)
    for _ in range(rounds):
        for label, fn in fns.items():
            rates[label] = max(rates[label], best_rate(fn, 1))
    return rates


def numpy_loop(x: np.ndarray, y: np.ndarray, epochs: int, take: bool = False) -> int:
    """The hand-written baseline: permute, slice, gather (`x[idx]` or `x.take(idx, 0)`)."""
    n = len(x)
    count = 0
    for epoch in range(epochs):
        perm = np.random.default_rng([0, epoch]).permutation(n)
        for b in range(n // BATCH):
            idx = perm[b * BATCH : (b + 1) * BATCH]
            if take:
                batch = {"x": x.take(idx, axis=0), "y": y.take(idx, axis=0)}
            else:
                batch = {"x": x[idx], "y": y[idx]}
            count += batch["x"].shape[0] > 0
    return count


def engine_loop(dataset: object, epochs: int, **kwargs: object) -> int:
    """Drain `make_batches(dataset, 256, num_epochs=epochs)`."""
    count = 0
    for batch in make_batches(dataset, BATCH, seed=0, num_epochs=epochs, **kwargs):
        count += batch["x"].shape[0] > 0
    return count


def zarr_fancy_loop(cache: CachedDataset, epochs: int, max_batches: int) -> int:
    """Naive reference: one zarr fancy-index read per key per batch."""
    arrays = cache._zarrays  # noqa: SLF001 - benchmark reference only
    n = len(cache)
    count = 0
    for epoch in range(epochs):
        perm = np.random.default_rng([0, epoch]).permutation(n)
        for b in range(n // BATCH):
            idx = np.sort(perm[b * BATCH : (b + 1) * BATCH])
            _ = {k: a.get_orthogonal_selection((idx,)) for k, a in arrays.items()}
            count += 1
            if count >= max_batches:
                return count
    return count


def row(label: str, rate: float, unit: str, ref: float | None, ref_label: str) -> str:
    ratio = f"{rate / ref:6.2f}x {ref_label}" if ref else ""
    return f"  {label:<46} {rate:>12,.0f} {unit:<10} {ratio}"


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'s' * (count != 1)}"


# One result row of this benchmark (see _shared.row): value and ratio rounded to 3 decimals.
result = functools.partial(row_of, "data")


def main() -> None:
    parser = make_parser(
        __doc__,
        quick_help="best of 3 rounds of 2 epochs, 1000 simulated items (explicit values win)",
        repeats=7,
    )
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--sim-items", type=int, default=3_000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    apply_quick(parser, args, QUICK)
    rows: list[dict[str, Any]] = []

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, 8), dtype=np.float32)
    y = rng.standard_normal((args.rows, 1), dtype=np.float32)
    dataset = ArrayDataset(x=x, y=y)
    unblocked = Unblocked(x=x, y=y)
    make_batches(dataset, BATCH, num_epochs=1)  # import grain outside the timings
    tmp = Path(tempfile.mkdtemp(prefix="bench_data_"))
    try:
        print(
            f"rows={args.rows}, batch={BATCH}, epochs={args.epochs}, best of {args.repeats} "
            f"alternating rounds; {os.cpu_count()} CPUs, load average "
            f"{os.getloadavg()[0]:.1f} at the start\n"
        )

        # 1. engine vs numpy -----------------------------------------------------------
        rates = compare(
            {
                "numpy": lambda: numpy_loop(x, y, args.epochs),
                "take": lambda: numpy_loop(x, y, args.epochs, take=True),
                "engine": lambda: engine_loop(dataset, args.epochs),
                "engine1": lambda: engine_loop(unblocked, args.epochs),
            },
            args.repeats,
        )
        print("1. In-memory ArrayDataset")
        print(row("numpy loop, x[idx]", rates["numpy"], "batches/s", None, ""))
        print(row("numpy loop, x.take(idx, axis=0)", rates["take"], "batches/s", None, ""))
        print(
            row(
                "make_batches(ArrayDataset)",
                rates["engine"],
                "batches/s",
                rates["numpy"],
                "x[idx] loop",
            )
        )
        print(row("", rates["engine"], "batches/s", rates["take"], "take loop"))
        print(
            row(
                "  same, one batch per gather (K=1)",
                rates["engine1"],
                "batches/s",
                rates["take"],
                "take loop",
            )
        )
        print(f"  (the engine gathers K={dataset.gather_block_rows // BATCH} batches per call)")
        rate_metric = (
            f"batches/s, best of {plural(args.repeats, 'round')} of {plural(args.epochs, 'epoch')}"
        )
        setup = f"{args.rows} rows x 8 features + 1 target, float32, batch {BATCH}"
        rows += [
            result(
                "in-memory: numpy loop, x[idx]",
                rate_metric,
                rates["numpy"],
                "batches/s",
                note=f"reference; {setup}",
            ),
            result(
                "in-memory: numpy loop, x.take(idx, axis=0)",
                rate_metric,
                rates["take"],
                "batches/s",
                note="reference",
            ),
            result(
                "in-memory: make_batches(ArrayDataset)",
                rate_metric + " (ratio: x the x[idx] loop)",
                rates["engine"],
                "batches/s",
                ratio=rates["engine"] / rates["numpy"],
            ),
            result(
                "in-memory: make_batches(ArrayDataset)",
                rate_metric + " (ratio: x the take loop)",
                rates["engine"],
                "batches/s",
                ratio=rates["engine"] / rates["take"],
                note=f"the engine gathers K={dataset.gather_block_rows // BATCH} batches per call",
            ),
            result(
                "in-memory: make_batches, one batch per gather (K=1)",
                rate_metric + " (ratio: x the take loop)",
                rates["engine1"],
                "batches/s",
                ratio=rates["engine1"] / rates["take"],
            ),
        ]

        # 2. cached ---------------------------------------------------------------------
        t0 = time.perf_counter()
        CachedDataset.build(dataset, tmp / "cache.zarr")
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        cached = CachedDataset(tmp / "cache.zarr")
        open_s = time.perf_counter() - t0
        rates = compare(
            {
                "mem": lambda: engine_loop(dataset, args.epochs),
                "cached": lambda: engine_loop(cached, args.epochs),
            },
            args.repeats,
        )
        mem, cached_rate = rates["mem"], rates["cached"]
        fancy = best_rate(lambda: zarr_fancy_loop(cached, 1, 200), 1)
        print(
            f"\n2. Local CachedDataset, chunk {cached.chunk_size} rows (build {build_s:.2f} s, "
            f"open+load {open_s * 1000:.0f} ms)"
        )
        print(row("make_batches(ArrayDataset) (in-memory rate)", mem, "batches/s", None, ""))
        print(
            row(
                "make_batches(CachedDataset), loaded in memory",
                cached_rate,
                "batches/s",
                mem,
                "in-memory",
            )
        )
        print(row("naive zarr fancy-index read per batch", fancy, "batches/s", mem, "in-memory"))
        rows += [
            result(
                "local cache: CachedDataset.build of the ArrayDataset",
                "build wall time",
                build_s,
                "s",
                note=f"{args.rows} rows, chunk {cached.chunk_size} rows",
            ),
            result("local cache: CachedDataset open + load", "wall time", open_s * 1000, "ms"),
            result(
                "local cache: make_batches(ArrayDataset), in-memory rate",
                rate_metric,
                mem,
                "batches/s",
                note="reference",
            ),
            result(
                "local cache: make_batches(CachedDataset), loaded in memory",
                rate_metric + " (ratio: x in-memory rate)",
                cached_rate,
                "batches/s",
                ratio=cached_rate / mem,
            ),
            result(
                "local cache: naive zarr fancy-index read per batch",
                "batches/s, one run of 200 batches (ratio: x in-memory rate)",
                fancy,
                "batches/s",
                ratio=fancy / mem,
            ),
        ]

        # 2b. out-of-core: 10x the rows, a budget of a few chunks ---------------------------
        big_rows = 10 * args.rows
        big = ArrayDataset(
            x=rng.standard_normal((big_rows, 8), dtype=np.float32),
            y=rng.standard_normal((big_rows, 1), dtype=np.float32),
        )
        CachedDataset.build(big, tmp / "big.zarr", chunk_size=32_768)
        budget = 8 << 20
        ooc = CachedDataset(tmp / "big.zarr", memory_budget_bytes=budget, shuffle_window=4)
        rates = compare(
            {
                "mem": lambda: engine_loop(big, 1),
                "ooc": lambda: engine_loop(ooc, 1),
                "prefetch": lambda: engine_loop(ooc, 1, prefetch=2),
            },
            max(1, args.repeats // 2),
        )
        big_mem, ooc_rate, ooc_prefetch = rates["mem"], rates["ooc"], rates["prefetch"]
        print(
            f"\n2b. Out-of-core CachedDataset: {big_rows} rows ({big_rows * 36 >> 20} MiB), chunk "
            f"32768 rows, {budget >> 20} MiB budget, shuffle window 4 chunks"
        )
        print(row("make_batches(ArrayDataset) (in-memory rate)", big_mem, "batches/s", None, ""))
        print(
            row(
                "make_batches(CachedDataset), chunk cache",
                ooc_rate,
                "batches/s",
                big_mem,
                "in-memory",
            )
        )
        print(row("  same, prefetch=2", ooc_prefetch, "batches/s", big_mem, "in-memory"))
        epochs_read = 2 * max(1, args.repeats // 2)
        print(
            f"  ({ooc.chunk_reads} chunk reads over {epochs_read} shuffled epochs of "
            f"{-(-big_rows // 32_768)} chunks)"
        )
        ooc_metric = f"batches/s, best of {plural(max(1, args.repeats // 2), 'round')} of 1 epoch"
        rows += [
            result(
                "out-of-core: make_batches(ArrayDataset), in-memory rate",
                ooc_metric,
                big_mem,
                "batches/s",
                note=f"reference; {big_rows} rows ({big_rows * 36 >> 20} MiB)",
            ),
            result(
                "out-of-core: make_batches(CachedDataset), chunk cache",
                ooc_metric + " (ratio: x in-memory rate)",
                ooc_rate,
                "batches/s",
                ratio=ooc_rate / big_mem,
                target=">= 0.5x in-memory",
                ok=ooc_rate / big_mem >= 0.5,
                note=(
                    f"chunk 32768 rows, {budget >> 20} MiB budget, shuffle window 4 chunks; "
                    f"{ooc.chunk_reads} chunk reads over {epochs_read} shuffled epochs of "
                    f"{-(-big_rows // 32_768)} chunks"
                ),
            ),
            result(
                "out-of-core: same, prefetch=2",
                ooc_metric + " (ratio: x in-memory rate)",
                ooc_prefetch,
                "batches/s",
                ratio=ooc_prefetch / big_mem,
            ),
        ]

        # 3. parallel build --------------------------------------------------------------
        sim = SimulationDataset(
            oscillator, prior, args.sim_items, seed=0, param_key="theta", output_key="x"
        )
        chunk = max(1, args.sim_items // 8)
        t0 = time.perf_counter()
        serial = CachedDataset.build(sim, tmp / "serial.zarr", chunk_size=chunk)
        serial_s = time.perf_counter() - t0
        print(
            f"\n3. CachedDataset.build of a SimulationDataset ({args.sim_items} items, "
            f"chunk {chunk})"
        )
        print(row("serial (workers=0)", args.sim_items / serial_s, "items/s", None, ""))
        build_metric = "items/s, one build"
        rows.append(
            result(
                "parallel build: CachedDataset.build, serial (workers=0)",
                build_metric,
                args.sim_items / serial_s,
                "items/s",
                note=(
                    f"reference; SimulationDataset of {args.sim_items} items, chunk {chunk}, "
                    f"{serial_s:.2f} s"
                ),
            )
        )
        idx = np.arange(args.sim_items)
        reference = serial.get_batch(idx)
        for context in ("spawn", "fork"):
            t0 = time.perf_counter()
            parallel = CachedDataset.build(
                sim,
                tmp / f"{context}.zarr",
                chunk_size=chunk,
                workers=args.workers,
                mp_context=context,
            )
            parallel_s = time.perf_counter() - t0
            got = parallel.get_batch(idx)
            same = all(reference[k].tobytes() == got[k].tobytes() for k in reference)
            print(
                row(
                    f"workers={args.workers}, mp_context={context!r}",
                    args.sim_items / parallel_s,
                    "items/s",
                    args.sim_items / serial_s,
                    "serial",
                )
            )
            print(f"  {'':<46} {parallel_s:>8.2f} s vs serial {serial_s:.2f} s, same bytes: {same}")
            case = f"parallel build: workers={args.workers}, mp_context={context!r}"
            differ = [k for k in reference if reference[k].tobytes() != got[k].tobytes()]
            rows += [
                result(
                    case,
                    build_metric + " (ratio: x serial)",
                    args.sim_items / parallel_s,
                    "items/s",
                    ratio=serial_s / parallel_s,
                    note=f"{parallel_s:.2f} s vs serial {serial_s:.2f} s",
                ),
                result(
                    case,
                    "keys whose bytes differ from the serial build",
                    float(len(differ)),
                    "keys",
                    target="0",
                    ok=not differ,
                    note=", ".join(differ) or None,
                ),
            ]
        print(f"\nload average {os.getloadavg()[0]:.1f} at the end")
        if args.json:
            write_rows(args.json, rows)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
