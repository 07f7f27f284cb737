"""Side-by-side: one grid of short trials run by the serial, process and Ray executors.

```bash
uv run python benchmarks/bench_sweep.py                      # 8 Equinox trials, 2 workers
uv run python benchmarks/bench_sweep.py --backend numpy      # the numpy reference backend
uv run python benchmarks/bench_sweep.py --steps 1500 --steps-per-execution 1 --no-ray
uv run python benchmarks/bench_sweep.py --quick --json /tmp/sweep.json   # run_all convention
```

The trials sweep the learning rate (4 values x 2 seeds) of a 4->128->128->1 MLP, batch
64, with 50 optimizer steps fused per compiled call (`Equinox(steps_per_execution=50)`).
What bounds the process executor's gain on 2 cores:

- each worker pays its own start-up (import, model init, compilation; about 7 s alone,
  9-11 s when both workers start at once, since XLA compiles on more than one thread),
  where the serial executor pays it once. Short trials cannot hide that: the target
  needs about 4 s of training per trial. The default, 60000 steps, gives that on a
  quiet 2-core machine (measured 2026-12-02: 32.4 s of training over 8 trials, process
  0.62x serial); 20000 steps gave 1.5 s a trial there and 0.69x. 1500-step trials
  (`--quick`) do not reach it.
- with one step per call (`--steps-per-execution 1`), one jax process already keeps
  about 1.5 cores busy (Python dispatch beside XLA's execution), so two of them on two
  cores finish trials only 1.3-1.5x as fast as one.

A constant learning rate lives in the Equinox optimizer state, so all trials of a
learning-rate sweep share one compilation per process.

Each executor runs in a fresh interpreter (`python bench_sweep.py --child ...`), so each
one pays its own framework import and compilation, as a user's sweep would: the serial
executor once, in the one process; the process executor once per worker, in parallel;
Ray once per worker plus the start of a local Ray runtime (reported separately).
The reported time is the wall time of `HyperSweep.run()`. All executors must produce the
same trained weights (each trial is deterministic, wherever it runs).

Columns: `sweep wall s` is the wall time of `HyperSweep.run()`; `interpreter s` the whole
child interpreter (imports, Ray start); `trial s (sum)` the trials' own wall times added
up (building the loop, first-use imports and compilation, training); `training s (sum)`
the `TrainingArtifact.wall_time_s` of the trials added up.

Target: process (2 workers) <= 0.65 x serial on 8 trials.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _shared import (
    apply_quick,
    child_env,
    make_parser,
    print_result,
    read_result,
    row,
    write_rows,
)

TRIAL = "pipekit_train.sweep.testing:backend_trial"


def _grid(args: argparse.Namespace) -> Any:
    from pipekit_train.sweep import ParameterGrid

    spec: dict[str, Any] = {"backend": [args.backend]}
    if args.backend == "equinox":
        spec["factory"] = ["pipekit_train.equinox.testing:mlp"]
        spec["factory_kwargs"] = [{"width": args.width, "depth": 2}]
        spec["steps_per_execution"] = [args.steps_per_execution]
    spec.update(
        {
            "lr": [3e-4, 1e-3, 3e-3, 1e-2][: max(1, args.trials // 2)],
            "seed": [0, 1],
            "max_steps": [args.steps],
            "batch_size": [64],
            "n_train": [4096],
            "validate_every": [max(1, args.steps // 4)],
        }
    )
    return ParameterGrid(spec)


def child(args: argparse.Namespace) -> dict[str, Any]:
    """Run one sweep with one executor; its timings."""
    from pipekit_train.sweep import HyperSweep

    ray_init_s = None
    if args.child == "ray":
        import ray

        t0 = time.perf_counter()
        ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
        ray_init_s = time.perf_counter() - t0
    grid = _grid(args)
    sweep = HyperSweep(
        TRIAL,
        grid,
        "val_loss",
        executor=args.child,
        max_concurrent=None if args.child == "serial" else args.workers,
        directory=args.directory,
    )
    t0 = time.perf_counter()
    result = sweep.run()
    wall = time.perf_counter() - t0
    if ray_init_s is not None:
        import ray

        ray.shutdown()
    return {
        "executor": args.child,
        "wall_s": wall,
        "ray_init_s": ray_init_s,
        "trials": len(result),
        "ok": len(result.by_status("ok")),
        "train_s": sum(t.summary.get("wall_time_s", 0.0) for t in result),
        "trial_s": sum(t.wall_time_s for t in result),
        "slowest_s": max(t.wall_time_s for t in result),
        "best": result.best.params["lr"] if result.ranked() else None,
        "best_value": result.best.value if result.ranked() else None,
        "weights": [t.weights_sha256 for t in result],
        "errors": [t.error for t in result if t.error],
    }


def _run_child(executor: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        executor,
        "--directory",
        str(root / executor),
        "--backend",
        args.backend,
        "--trials",
        str(args.trials),
        "--steps",
        str(args.steps),
        "--width",
        str(args.width),
        "--workers",
        str(args.workers),
        "--steps-per-execution",
        str(args.steps_per_execution),
    ]
    env = child_env()
    # Under `uv run`, Ray would start each worker through `uv run` again; not wanted here.
    env.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    total = time.perf_counter() - t0
    out = read_result(proc.stdout)
    if proc.returncode != 0 or out is None:
        raise SystemExit(f"{executor} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    out["process_s"] = total
    return out


def main() -> None:
    parser = make_parser(__doc__, quick_help="1500 steps per trial instead of 60000")
    parser.add_argument("--backend", default="equinox", choices=["equinox", "numpy"])
    parser.add_argument(
        "--trials", type=int, default=8, help="grid size (lr x 2 seeds), even, <= 8"
    )
    parser.add_argument("--steps", type=int, default=60000, help="optimizer steps per trial")
    parser.add_argument(
        "--steps-per-execution",
        type=int,
        default=50,
        help="optimizer steps fused per call (equinox)",
    )
    parser.add_argument("--width", type=int, default=128, help="MLP width (equinox)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--child", choices=["serial", "process", "ray"], help=argparse.SUPPRESS)
    parser.add_argument("--directory", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print_result(child(args))
        return
    apply_quick(parser, args, {"steps": 1500})
    if args.backend == "equinox":
        import importlib.util

        if importlib.util.find_spec("pipekit_train.equinox") is None:
            raise SystemExit("pipekit-train-equinox is not installed; use --backend numpy")
    executors = ["serial", "process"] + ([] if args.no_ray else ["ray"])
    print(
        f"# bench_sweep: {args.trials} {args.backend} trials x {args.steps} steps "
        + (
            f"(MLP 4->{args.width}->{args.width}->1, batch 64, "
            f"{args.steps_per_execution} steps per call), "
            if args.backend == "equinox"
            else "(linear, batch 64), "
        )
        + f"{args.workers} workers; "
        f"{os.cpu_count()} CPUs, python {platform.python_version()}, "
        f"load average before {os.getloadavg()[0]:.2f}"
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        for executor in executors:
            rows.append(_run_child(executor, args, Path(tmp)))
            print(f"#   {executor} done ({rows[-1]['wall_s']:.1f} s)", flush=True)
    serial = rows[0]["wall_s"]
    print()
    print(
        "| executor | workers | sweep wall s | x serial | interpreter s | Ray start s "
        "| slowest trial s | trial s (sum) | training s (sum) | trials ok | best lr |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        workers = 1 if r["executor"] == "serial" else args.workers
        ray_s = "" if r["ray_init_s"] is None else f"{r['ray_init_s']:.1f}"
        print(
            f"| {r['executor']} | {workers} | {r['wall_s']:.1f} | {r['wall_s'] / serial:.2f} | "
            f"{r['process_s']:.1f} | {ray_s} | {r['slowest_s']:.1f} | {r['trial_s']:.1f} | "
            f"{r['train_s']:.1f} | "
            f"{r['ok']}/{r['trials']} | {r['best']} |"
        )
    same = all(r["weights"] == rows[0]["weights"] for r in rows)
    ratio = rows[1]["wall_s"] / serial
    print()
    print(f"weights identical across executors: {same}")
    print(f"process/serial = {ratio:.2f} (target <= 0.65: {'met' if ratio <= 0.65 else 'NOT met'})")
    print(f"load average after {os.getloadavg()[0]:.2f}")
    for r in rows:
        if r["errors"]:
            print(f"{r['executor']} errors: {r['errors'][:3]}")
    if args.json:
        _write_json(args, rows)


def _write_json(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    serial = rows[0]["wall_s"]
    out = []
    for r in rows:
        workers = 1 if r["executor"] == "serial" else args.workers
        note = (
            f"{args.trials} {args.backend} trials x {args.steps} steps "
            f"({args.steps_per_execution} per call); fresh interpreter per executor; "
            f"slowest trial (a worker's first: import + compile) {r['slowest_s']:.1f} s"
        )
        if r["ray_init_s"] is not None:
            note += f"; Ray runtime start {r['ray_init_s']:.1f} s not included"
        ratio = r["wall_s"] / serial
        out.append(
            row(
                "sweep",
                f"{r['executor']} executor, {workers} worker(s)",
                "HyperSweep.run() wall time (ratio: x serial)",
                r["wall_s"],
                "s",
                ratio=ratio,
                target="<= 0.65" if r["executor"] == "process" else None,
                ok=(ratio <= 0.65) if r["executor"] == "process" else None,
                note=note,
                digits=2,
            )
        )
    write_rows(args.json, out)


if __name__ == "__main__":
    main()
