"""The cost of the non-finite loss policy, side by side on every backend.

```bash
uv run python benchmarks/bench_nonfinite.py                  # 2000 steps, best of 3
uv run python benchmarks/bench_nonfinite.py --backends equinox keras --repeats 5
uv run python benchmarks/bench_nonfinite.py --quick --json /tmp/nonfinite.json   # run_all convention
```

`TrainingLoop(on_nonfinite=...)` with `"ignore"` (no check: the behaviour before the
policy existed), `"stop"` (the default: core checks each loss when a group of metrics is
fetched, no extra host sync) and `"skip"` (the backend's step also keeps the old state
where the loss is not finite: a `where` per state array inside the compiled step on
Equinox and Keras-jax, one host sync per step plus a copy of the floating buffers on
Lightning). Clean data, so no step is skipped: this is the price of the check alone.

Cases: a 2 -> 32 -> 1 tanh MLP, MSE, Adam, batch 32 (small, so per-step overhead shows),
on Equinox (`steps_per_execution` 1 and 10), Lightning (CPU) and Keras on its configured
backend (jax by default). The three policies of a case run interleaved, `--repeats`
times, in this process; a metric writer timestamps the flush of step `--warmup` and of
the last step (metrics are fetched in groups of 50, each fetch waits for the device), so
the rate covers steps `warmup+1 .. steps` without compilation or set-up. Best rate kept.

Rows follow `benchmarks/run_all.py`: `ratio` is relative to `"ignore"` in the same case.
Target for `"stop"`: >= 0.95 (within the noise of a shared machine); `"skip"` has no
target (it does more work by design).
"""

from __future__ import annotations

import argparse
import functools
import os
import time
from collections.abc import Callable
from typing import Any

from _shared import apply_quick, make_data, row, write_rows

os.environ.setdefault("KERAS_BACKEND", "jax")

POLICIES = ("ignore", "stop", "skip")
BACKENDS = ("equinox", "equinox-fused", "lightning", "keras")
QUICK = {"steps": 600, "warmup": 100, "repeats": 2}
STOP_TARGET = 0.95

result = functools.partial(row, "nonfinite", digits=1)


class _Clock:
    """A metric writer that timestamps the flush of two given steps."""

    def __init__(self, marks: tuple[int, int]):
        self.marks = set(marks)
        self.times: dict[int, float] = {}

    def write(self, step: int, metrics: dict[str, float]) -> None:
        if step in self.marks and step not in self.times:
            self.times[step] = time.perf_counter()


def _model_and_adapter(backend: str) -> tuple[Any, Any]:
    kwargs = {"in_size": 2, "out_size": 1, "width": 32, "depth": 1, "seed": 0}
    if backend.startswith("equinox"):
        from pipekit_train.equinox import Equinox, EquinoxModelOp

        k = 10 if backend == "equinox-fused" else 1
        op = EquinoxModelOp("pipekit_train.equinox.testing:mlp", **kwargs)
        return op, Equinox(steps_per_execution=k)
    if backend == "lightning":
        from pipekit_train.lightning import Lightning, LightningModelOp

        op = LightningModelOp("pipekit_train.lightning.testing:mlp", **kwargs)
        return op, Lightning(accelerator="cpu")
    from pipekit_train.keras import Keras, KerasModelOp

    return KerasModelOp("pipekit_train.keras.testing:mlp", **kwargs), Keras()


def run_once(backend: str, policy: str, data: Any, steps: int, warmup: int) -> float:
    """Steps/s of one `TrainingLoop.run()` over steps `warmup+1 .. steps`."""
    from pipekit_train.core import TrainingLoop

    model, adapter = _model_and_adapter(backend)
    clock = _Clock((warmup, steps))
    TrainingLoop(
        model=model,
        data=data,
        loss="mse",
        optimizer_config={"name": "adam", "lr": 1e-3},
        batch_size=32,
        max_steps=steps,
        seed=0,
        adapter=adapter,
        writers=[clock],
        log_every_n_steps=50,
        on_nonfinite=policy,
        progress=False,
    ).run()
    return (steps - warmup) / (clock.times[steps] - clock.times[warmup])


def bench_case(
    backend: str, data: Any, args: argparse.Namespace, say: Callable[[str], None]
) -> dict[str, float]:
    """Best steps/s per policy, the policies interleaved."""
    best = dict.fromkeys(POLICIES, 0.0)
    for repeat in range(args.repeats):
        for policy in POLICIES:
            rate = run_once(backend, policy, data, args.steps, args.warmup)
            best[policy] = max(best[policy], rate)
            say(f"  {backend:14s} {policy:6s} run {repeat + 1}: {rate:9.1f} steps/s")
    return best


def case_rows(backend: str, best: dict[str, float], args: argparse.Namespace) -> list[dict]:
    metric = (
        f"steps/s, steps {args.warmup + 1}..{args.steps}, best of {args.repeats} "
        "(ratio: x on_nonfinite='ignore')"
    )
    rows = []
    for policy in POLICIES:
        ratio = best[policy] / best["ignore"]
        stop = policy == "stop"
        rows.append(
            result(
                f"{backend}: on_nonfinite={policy!r}",
                metric,
                best[policy],
                "steps/s",
                ratio=ratio,
                target=f">= {STOP_TARGET:g}" if stop else None,
                ok=ratio >= STOP_TARGET if stop else None,
                note="the default" if stop else None,
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--quick", action="store_true", help="a short run (run_all)")
    parser.add_argument("--json", help="also write the result rows to this JSON file")
    args = parser.parse_args()
    apply_quick(parser, args, QUICK)
    if args.warmup % 50 or args.steps % 50 or args.warmup >= args.steps:
        parser.error("--warmup and --steps must be multiples of 50, warmup < steps")
    data = make_data(2, 4096)
    rows: list[dict[str, Any]] = []
    for backend in args.backends:
        best = bench_case(backend, data, args, print)
        rows += case_rows(backend, best, args)
    print()
    print(f"{'case':40s} {'steps/s':>10s} {'x ignore':>9s}")
    for r in rows:
        print(f"{r['case']:40s} {r['value']:10.1f} {r['ratio']:9.3f}")
    if args.json:
        write_rows(args.json, rows)


if __name__ == "__main__":
    main()
