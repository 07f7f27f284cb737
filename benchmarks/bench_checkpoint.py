"""How long a checkpoint blocks the training thread: asynchronous vs synchronous saves.

    uv run python benchmarks/bench_checkpoint.py [--quick] [--mb 50] [--json PATH]

A ~50 MB training state (float32 arrays) is saved every `--every` steps of a simulated
training loop. Each step spends `--step-ms` doing small numpy matmuls on the training
thread, and the number of matmuls done is the loop's training throughput.
Measured side by side, in one process, interleaved over `--repeats` rounds:

- `DirectoryCheckpointer` (core's atomic store, used by the Lightning and Keras adapters,
  the numpy reference and `OnlineTrainer`) with `async_save=False` and with
  `async_save=True`. Encoding the state to bytes always happens on the training thread,
  so the state is snapshotted. With async saves, the temporary-folder write, the fsyncs
  and the rename happen in a background thread;
- Orbax through `pipekit_train.equinox`'s `OrbaxCheckpointer`, synchronous and
  asynchronous, when `pipekit-train-equinox` is installed (skipped otherwise);
- the same loop without checkpoints, as the baseline for the wall-time overhead.

Metrics:

- the median time the training thread spends inside `save()`, which is what async
  saving is for;
- the loop's wall time relative to the baseline;
- the training throughput relative to the baseline. Background writes still compete for
  the CPU, and a save waits for the previous one.

Rows follow the convention in `benchmarks/run_all.py`.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one training thread: stable step work
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse
import functools
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _shared import row as row_of
from _shared import write_rows

from pipekit_train.core import Checkpoint
from pipekit_train.core.adapter import DirectoryCheckpointer
from pipekit_train.core.testing import decode_arrays, encode_arrays

META = {"step": 0, "data_iter": {"epoch": 0, "index": 0}, "run": {"history": {}}}


def make_state(mb: float, seed: int = 0) -> dict[str, np.ndarray]:
    """Eight float32 arrays totalling about `mb` megabytes."""
    rng = np.random.default_rng(seed)
    per = int(mb * 1e6 / 4 / 8)
    return {f"layer{i}/w": rng.standard_normal(per, dtype=np.float32) for i in range(8)}


class Work:
    """Numpy matmuls standing in for training steps.

    A step lasts a fixed time and counts the matmuls it completes. The wall time of a
    loop therefore stays bounded on a busy machine, and the matmul rate measures how much
    a background write slows training down.
    """

    def __init__(self, size: int = 128):
        rng = np.random.default_rng(1)
        self.a = rng.standard_normal((size, size), dtype=np.float32)
        self.b = rng.standard_normal((size, size), dtype=np.float32)

    def run_for(self, seconds: float) -> int:
        """Do matmuls for `seconds`; return how many were done."""
        deadline = time.perf_counter() + seconds
        count = 0
        while time.perf_counter() < deadline:
            self.a @ self.b
            count += 1
        return count


# -- checkpointers -------------------------------------------------------------------------
def directory_checkpointer(root: Path, async_save: bool) -> Any:
    policy = Checkpoint(root, every_n_steps=1, max_to_keep=2, async_save=async_save)
    return DirectoryCheckpointer(
        policy,
        encode=lambda state: {"arrays.bin": encode_arrays(state)},
        decode=lambda blobs, template: decode_arrays(blobs["arrays.bin"]),
    )


def orbax_factory() -> tuple[
    Callable[[Path, bool], Any] | None, Callable[[dict[str, np.ndarray]], Any] | None, str | None
]:
    """`(make_checkpointer, to_device_state, None)` or `(None, None, why it is skipped)`."""
    try:
        import jax
        import jax.numpy as jnp

        from pipekit_train.equinox._checkpoint import OrbaxCheckpointer
    except Exception as exc:  # not installed, or the adapter is not there yet
        return None, None, f"{type(exc).__name__}: {exc}"

    def make(root: Path, async_save: bool) -> Any:
        policy = Checkpoint(root, every_n_steps=1, max_to_keep=2, async_save=async_save)
        return OrbaxCheckpointer(
            policy,
            # The adapter donates its buffers, so the tree must be fresh arrays.
            to_tree=lambda state: {k: jnp.copy(v) for k, v in state.items()},
            template_tree=lambda state: {
                k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in state.items()
            },
            from_tree=lambda tree, template: dict(tree),
        )

    def to_device(state: dict[str, np.ndarray]) -> Any:
        out = {k: jnp.asarray(v) for k, v in state.items()}
        jax.block_until_ready(out)
        return out

    return make, to_device, None


# -- one measured loop -----------------------------------------------------------------------
def run_loop(
    make: Callable[[Path], Any] | None,
    state: Any,
    work: Work,
    step_s: float,
    steps: int,
    every: int,
) -> dict[str, Any]:
    """Run `steps` simulated steps, saving every `every` steps; return the timings."""
    root = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    ckpt = make(root / "ckpt") if make is not None else None
    blocks: list[float] = []
    matmuls = 0
    try:
        t0 = time.perf_counter()
        for step in range(1, steps + 1):
            matmuls += work.run_for(step_s)
            if ckpt is not None and step % every == 0:
                t = time.perf_counter()
                ckpt.save(step, state, {**META, "step": step}, {})
                blocks.append(time.perf_counter() - t)
        t = time.perf_counter()
        if ckpt is not None:
            ckpt.wait()
        final_wait = time.perf_counter() - t
        wall = time.perf_counter() - t0
    finally:
        if ckpt is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ckpt.close()
        shutil.rmtree(root, ignore_errors=True)
    return {
        "blocks": blocks,
        "wall": wall,
        "final_wait": final_wait,
        "rate": matmuls / (steps * step_s),
    }


# One result row of this benchmark (see _shared.row); value and ratio as measured.
row = functools.partial(row_of, "checkpoint", digits=None, ratio_digits=None)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 3 saves, 40 steps apart")
    parser.add_argument("--mb", type=float, default=50.0, help="state size in MB")
    parser.add_argument("--step-ms", type=float, default=20.0, help="simulated step time (ms)")
    parser.add_argument(
        "--every",
        type=int,
        default=50,
        help="steps between saves (leave the background write time to finish)",
    )
    parser.add_argument("--saves", type=int, default=4, help="saves per loop")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--no-orbax", action="store_true")
    parser.add_argument("--json", dest="json_path", default=None, help="write the rows here")
    args = parser.parse_args(argv)
    if args.quick:
        args.saves, args.repeats, args.every = 3, 2, 40

    state = make_state(args.mb)
    size_mb = sum(v.nbytes for v in state.values()) / 1e6
    work = Work()
    step_s = args.step_ms / 1e3
    steps = args.every * args.saves

    cases: dict[str, tuple[Callable[[Path], Any] | None, Any]] = {
        "no checkpoint": (None, state),
        "DirectoryCheckpointer sync": (lambda root: directory_checkpointer(root, False), state),
        "DirectoryCheckpointer async": (lambda root: directory_checkpointer(root, True), state),
    }
    orbax_note = None
    if not args.no_orbax:
        make_orbax, to_device, orbax_note = orbax_factory()
        if make_orbax is not None and to_device is not None:
            device_state = to_device(state)
            cases["Orbax (equinox) sync"] = (lambda root: make_orbax(root, False), device_state)
            cases["Orbax (equinox) async"] = (lambda root: make_orbax(root, True), device_state)

    results: dict[str, list[dict[str, Any]]] = {name: [] for name in cases}
    for _ in range(args.repeats):
        for name, (make, st) in cases.items():  # interleaved: machine noise hits every case
            results[name].append(run_loop(make, st, work, step_s, steps, args.every))

    def block_ms(name: str) -> float:
        return 1e3 * statistics.median(b for r in results[name] for b in r["blocks"])

    def wall_s(name: str) -> float:
        return min(r["wall"] for r in results[name])

    def rate(name: str) -> float:
        return statistics.median(r["rate"] for r in results[name])

    base_wall, base_rate = wall_s("no checkpoint"), rate("no checkpoint")
    rows = [
        row(
            "no checkpoint",
            f"loop wall time ({steps} steps of {args.step_ms:.0f} ms)",
            base_wall,
            "s",
            note=f"{size_mb:.0f} MB state, a save every {args.every} steps",
        ),
        row("no checkpoint", "training throughput (matmuls/s in steps)", base_rate, "matmul/s"),
    ]
    print(
        f"state {size_mb:.1f} MB; {steps} steps of {args.step_ms:.0f} ms, a save every {args.every} steps; "
        f"{args.repeats} rounds"
    )
    print(f"{'case':<30} {'block/save':>11} {'loop wall':>10} {'wall x':>7} {'train rate x':>13}")
    print(f"{'no checkpoint':<30} {'':>11} {base_wall:9.2f}s {1.0:7.2f} {1.0:13.2f}")
    for engine in ("DirectoryCheckpointer", "Orbax (equinox)"):
        sync, asyn = f"{engine} sync", f"{engine} async"
        if sync not in results:
            continue
        b_sync, b_async = block_ms(sync), block_ms(asyn)
        rows.append(row(sync, "training-thread block per save (median)", b_sync, "ms"))
        rows.append(
            row(
                asyn,
                "training-thread block per save (median)",
                b_async,
                "ms",
                ratio=b_async / b_sync,
                target="<= 0.5x sync",
                ok=b_async <= 0.5 * b_sync,
            )
        )
        for name in (sync, asyn):
            rows.append(
                row(
                    name,
                    "loop wall time vs no checkpoint",
                    wall_s(name),
                    "s",
                    ratio=wall_s(name) / base_wall,
                )
            )
            rows.append(
                row(
                    name,
                    "training throughput (matmuls/s in steps) vs no checkpoint",
                    rate(name),
                    "matmul/s",
                    ratio=rate(name) / base_rate,
                )
            )
            print(
                f"{name:<30} {block_ms(name):9.1f}ms {wall_s(name):9.2f}s {wall_s(name) / base_wall:7.2f} "
                f"{rate(name) / base_rate:13.2f}"
            )
    if orbax_note is not None and not args.no_orbax:
        rows.append(row("Orbax (equinox)", "skipped", None, "", note=orbax_note))
        print(f"Orbax skipped: {orbax_note}")

    if args.json_path:
        write_rows(args.json_path, rows)
    return rows


if __name__ == "__main__":
    main()
