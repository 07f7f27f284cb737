"""Side-by-side: one training description run on every backend.

```bash
uv run python benchmarks/bench_backends.py                  # 3000 steps, 3 runs per backend
uv run python benchmarks/bench_backends.py --steps 1000 --backends equinox keras-jax
uv run python benchmarks/bench_backends.py --quick --json /tmp/backends.json   # run_all convention
uv run python benchmarks/bench_backends.py --grad-norm --steps 1000   # log_grad_norm on vs off
```

`--grad-norm` measures what `TrainingLoop(log_grad_norm=True)` costs: each child
alternates runs with it off and on (the first pair warms up both) and the table shows
both rates and their ratio, side by side in the same process.

The description is `examples/direct.py`'s: a 3 -> 64 -> 64 -> 1 tanh MLP regressing
`sin(2 x0) + x1^2 - 0.5 x2` on 3,277 samples, MSE, Adam (lr 3e-3), batch 64, validation
on 410 samples every `steps / 10` steps, seed 0. Only the model operator changes
(`examples/toymodels.py`: an Equinox module, a torch module, a Keras model); the adapter
is each model operator's default (`Equinox()`, `Lightning()`, `Keras()`).

Each backend runs in a fresh interpreter (`--child`), which builds the loop and runs it
`--repeats` times: the first run includes compilation (jit, `torch` warm-up, Keras's
`train_function`); the later ones are timed for steps/s (best of them). Columns: steps/s
after warm-up and its ratio to the Equinox adapter, the first run's wall time, the
interpreter's whole wall time (imports included), the validation loss at the end and the
test RMSE (the noise floor is 0.02). No target: the backends differ in kernels and
dispatch cost, and this shows by how much on this machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _shared import (
    apply_quick,
    child_env,
    make_parser,
    print_result,
    read_result,
    registered_name,
    row,
    write_rows,
)

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples"
BACKENDS = ("equinox", "lightning", "keras-jax", "keras-torch")


def child(args: argparse.Namespace) -> dict[str, Any]:
    """Build the loop once per run, run it `repeats` times; the timings."""
    t_start = time.perf_counter()
    sys.path.insert(0, str(EXAMPLES))
    import numpy as np
    import toymodels
    from direct import make_data

    from pipekit_train.core import TrainingLoop
    from pipekit_train.core.data import split

    backend = registered_name(args.child)  # keras-jax: Keras, on the KERAS_BACKEND of child_env
    train, val, test = split(make_data(), (0.8, 0.1, 0.1), seed=0)
    walls: list[float] = []
    norm_walls: list[float] = []
    artifact = None
    modes = [False, True] if args.grad_norm else [False]
    for _ in range(args.repeats):
        for with_norm in modes:
            loop = TrainingLoop(
                model=toymodels.model_op(backend, in_size=3, out_size=1, width=64, seed=0),
                data=train,
                validation=val,
                loss="mse",
                metrics=["mae"],
                optimizer_config={"name": "adam", "lr": 3e-3},
                batch_size=64,
                max_steps=args.steps,
                validate_every_n_steps=max(1, args.steps // 10),
                seed=0,
                progress=False,
                log_grad_norm=with_norm,
            )
            t0 = time.perf_counter()
            artifact = loop.run()
            (norm_walls if with_norm else walls).append(time.perf_counter() - t0)
    assert artifact is not None
    batch = test.get_batch(np.arange(len(test)))
    pred = np.asarray(artifact.model(batch["x"]))
    rmse = float(np.sqrt(np.mean((pred - batch["y"]) ** 2)))
    return {
        "backend": args.child,
        "first_s": walls[0],
        "best_s": min(walls[1:]) if len(walls) > 1 else walls[0],
        "val_loss": float(artifact.final_metrics.get("val_loss", float("nan"))),
        "test_rmse": rmse,
        "child_s": time.perf_counter() - t_start,
        "norm_best_s": min(norm_walls[1:]) if len(norm_walls) > 1 else None,
    }


def _run_child(name: str, args: argparse.Namespace) -> dict[str, Any] | None:
    cmd = [sys.executable, __file__, "--child", name, "--steps", str(args.steps)]
    cmd += ["--repeats", str(args.repeats)] + (["--grad-norm"] if args.grad_norm else [])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=child_env(name), capture_output=True, text=True)
    out = read_result(proc.stdout)
    if proc.returncode != 0 or out is None:
        print(f"# {name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}", flush=True)
        return None
    out["process_s"] = time.perf_counter() - t0
    return out


def main() -> None:
    parser = make_parser(
        __doc__,
        quick_help="1000 steps, 2 runs per backend",
        repeats=3,
        repeats_help="runs per backend (the first warms up)",
    )
    parser.add_argument("--steps", type=int, default=3000, help="optimizer steps per run")
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument(
        "--grad-norm", action="store_true", help="also time log_grad_norm=True (on/off ratio)"
    )
    parser.add_argument("--child", choices=BACKENDS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print_result(child(args))
        return
    apply_quick(parser, args, {"steps": 1000, "repeats": 2})
    if args.repeats < 2:
        raise SystemExit(
            f"--repeats must be at least 2 (the first run warms up). Received: {args.repeats}."
        )
    print(
        f"# bench_backends: examples/direct.py's task, {args.steps} steps x {args.repeats} runs "
        f"per backend; {os.cpu_count()} CPUs, python {platform.python_version()}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
        f"load average before {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    rows: dict[str, dict[str, Any] | None] = {}
    for name in args.backends:
        rows[name] = _run_child(name, args)
    ref = rows.get("equinox")
    ref_rate = args.steps / ref["best_s"] if ref else None
    print()
    print(
        "| backend | steps/s | x equinox | first run s | interpreter s | final val_loss | test RMSE |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        if r is None:
            print(f"| {name} | failed | | | | | |")
            continue
        rate = args.steps / r["best_s"]
        ratio = f"{rate / ref_rate:.2f}" if ref_rate else ""
        print(
            f"| {name} | {rate:.0f} | {ratio} | {r['first_s']:.1f} | {r['process_s']:.1f} | "
            f"{r['val_loss']:.4f} | {r['test_rmse']:.4f} |"
        )
    if args.grad_norm:
        print()
        print("| backend | steps/s grad_norm off | steps/s on | on / off |")
        print("|---|---|---|---|")
        for name, r in rows.items():
            if r is None or r.get("norm_best_s") is None:
                continue
            off, on = args.steps / r["best_s"], args.steps / r["norm_best_s"]
            print(f"| {name} | {off:.0f} | {on:.0f} | {on / off:.3f} |")
    print(f"load average after {os.getloadavg()[0]:.2f}")
    if args.json:
        out = []
        for name, r in rows.items():
            rate = None if r is None else args.steps / r["best_s"]
            out.append(
                row(
                    "backends",
                    f"{name}: examples/direct.py task, {args.steps} steps",
                    "steps/s after warm-up (ratio: x the Equinox adapter)",
                    rate,
                    "steps/s",
                    ratio=None if rate is None or not ref_rate else rate / ref_rate,
                    note="failed"
                    if r is None
                    else (
                        f"first run {r['first_s']:.1f} s, interpreter {r['process_s']:.1f} s, "
                        f"val_loss {r['val_loss']:.4f}, test RMSE {r['test_rmse']:.4f}"
                    ),
                    digits=1,
                )
            )
        write_rows(args.json, out)
    if all(r is None for r in rows.values()):
        raise SystemExit("every backend failed")


if __name__ == "__main__":
    main()
