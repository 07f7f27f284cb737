"""The cost of the non-finite loss policy, side by side on every backend.

```bash
uv run python benchmarks/bench_nonfinite.py                  # 4000 steps, best of 5
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
backend (jax by default). `--steps` is Equinox's run length; the other cases scale it to
similar wall times (fused x4, Keras x0.5, Lightning x0.25). The three policies of a case
run interleaved, `--repeats` times (in a rotating order, after a `gc.collect()`), in
this process; a metric writer timestamps the flush
of step `--warmup` and of the last step (metrics are fetched in groups of 50, each fetch
waits for the device), so the rate covers the steps after the warm-up without
compilation or set-up. Best rate kept; the note gives the least process CPU time per
step over the same steps (all threads), which other load on the machine disturbs less.

A last case times core's share alone, without a backend: `RunContext.record_step` with
a host loss, flushed every 50 steps, as microseconds per step (best of `--repeats` runs
of 100,000 steps). The `"stop"` check is the `isfinite` of each flushed loss.

Rows follow `benchmarks/run_all.py`: `ratio` is relative to `"ignore"` in the same case.
The training cases have no target: on a shared 2-core machine their run-to-run noise
(tens of percent) is far larger than the check. The target is on core's share: the
default `"stop"` adds at most 1 microsecond per step to `"ignore"`. `"skip"` does more
work by design (in the backend's step) and has no target.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import time
from collections.abc import Callable
from typing import Any

from _shared import (
    Clock,
    apply_quick,
    build_adapter,
    make_data,
    make_parser,
    mlp_op,
    row,
    write_rows,
)

os.environ.setdefault("KERAS_BACKEND", "jax")

POLICIES = ("ignore", "stop", "skip")
BACKENDS = ("equinox", "equinox-fused", "lightning", "keras")
SCALE = {"equinox": 1.0, "equinox-fused": 4.0, "lightning": 0.25, "keras": 0.5}
#: Each case's adapter options (Keras: on its configured backend).
ADAPTER_OPTIONS: dict[str, dict[str, Any]] = {
    "equinox": {"steps_per_execution": 1},
    "equinox-fused": {"steps_per_execution": 10},
    "lightning": {"accelerator": "cpu"},
    "keras": {},
}
QUICK = {"steps": 2000, "repeats": 3}
CORE_STEPS = 100_000
STOP_TARGET_US = 1.0  # the default check may add at most this to core's per-step cost

result = functools.partial(row, "nonfinite", digits=1)


def run_once(backend: str, policy: str, data: Any, steps: int, warmup: int) -> tuple[float, float]:
    """`(steps per wall second, CPU microseconds per step)` of one `TrainingLoop.run()`
    over steps `warmup+1 .. steps` (its clock reads itself when their metrics are flushed)."""
    from pipekit_train.core import TrainingLoop

    model = mlp_op(backend, 2, 32, 1)
    adapter = build_adapter(backend, **ADAPTER_OPTIONS[backend])
    clock = Clock(warmup, steps)
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
    return clock.rate(), clock.cpu_us()


def _rotated(repeat: int) -> tuple[str, ...]:
    """The policies in a different order each repeat (no policy always runs first)."""
    k = repeat % len(POLICIES)
    return POLICIES[k:] + POLICIES[:k]


def case_steps(backend: str, args: argparse.Namespace) -> int:
    """The run length of a case: `--steps` scaled, a multiple of 50 past the warm-up."""
    steps = int(args.steps * SCALE[backend]) // 50 * 50
    return max(steps, args.warmup + 100)


def bench_case(
    backend: str, data: Any, args: argparse.Namespace, say: Callable[[str], None]
) -> dict[str, float]:
    """Best steps/s per policy, the policies interleaved."""
    steps = case_steps(backend, args)
    best = dict.fromkeys(POLICIES, 0.0)
    cpu = dict.fromkeys(POLICIES, float("inf"))
    for repeat in range(args.repeats):
        for policy in _rotated(repeat):
            gc.collect()
            rate, micros = run_once(backend, policy, data, steps, args.warmup)
            best[policy] = max(best[policy], rate)
            cpu[policy] = min(cpu[policy], micros)
            say(
                f"  {backend:14s} {policy:6s} run {repeat + 1}: {rate:9.1f} steps/s, "
                f"{micros:8.1f} CPU us/step"
            )
    return {**best, **{f"cpu:{p}": cpu[p] for p in POLICIES}}


def core_cost(repeats: int, say: Callable[[str], None]) -> dict[str, float]:
    """Microseconds per recorded step of core's metric log (flushes included), best of `repeats`."""
    import numpy as np

    from pipekit_train.core import TrainingLoop
    from pipekit_train.core.data import ArrayDataset
    from pipekit_train.core.run._context import RunContext  # core's own share, no backend
    from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp

    data = ArrayDataset(x=np.zeros((64, 2), np.float32), y=np.zeros((64, 1), np.float32))
    losses = [np.float32(v) for v in np.linspace(1.0, 0.1, CORE_STEPS)]
    best = dict.fromkeys(POLICIES, float("inf"))
    for repeat in range(repeats):
        for policy in _rotated(repeat):
            gc.collect()
            plan = TrainingLoop(
                model=NumpyLinearOp("pipekit_train.core.testing:linear", in_size=2, out_size=1),
                data=data,
                batch_size=32,
                max_steps=CORE_STEPS,
                log_every_n_steps=50,
                on_nonfinite=policy,
                adapter=NumpyAdapter(),
                progress=False,
            ).plan
            ctx = RunContext(plan)
            t0 = time.perf_counter()
            log = ctx.metrics
            for loss in losses:
                log.record_step({"loss": loss})
            log.flush()
            micros = (time.perf_counter() - t0) / CORE_STEPS * 1e6
            best[policy] = min(best[policy], micros)
            say(f"  {'core':14s} {policy:6s} run {repeat + 1}: {micros:9.3f} us/step")
    return best


def core_rows(best: dict[str, float], repeats: int) -> list[dict]:
    metric = (
        f"us per MetricLog.record_step, {CORE_STEPS} steps flushed every 50, best of "
        f"{repeats} (ratio: x on_nonfinite='ignore')"
    )
    rows = []
    for policy in POLICIES:
        extra = best[policy] - best["ignore"]
        stop = policy == "stop"
        rows.append(
            row(
                "nonfinite",
                f"core alone: on_nonfinite={policy!r}",
                metric,
                best[policy],
                "us/step",
                ratio=best[policy] / best["ignore"],
                target=f"<= +{STOP_TARGET_US:g} us/step vs 'ignore'" if stop else None,
                ok=extra <= STOP_TARGET_US if stop else None,
                note=f"{extra:+.3f} us/step vs 'ignore'",
            )
        )
    return rows


def case_rows(backend: str, best: dict[str, float], args: argparse.Namespace) -> list[dict]:
    metric = (
        f"steps/s, steps {args.warmup + 1}..{case_steps(backend, args)}, best of "
        f"{args.repeats} (ratio: x on_nonfinite='ignore')"
    )
    rows = []
    for policy in POLICIES:
        ratio = best[policy] / best["ignore"]
        cpu_ratio = best[f"cpu:{policy}"] / best["cpu:ignore"]
        stop = policy == "stop"
        rows.append(
            result(
                f"{backend}: on_nonfinite={policy!r}",
                metric,
                best[policy],
                "steps/s",
                ratio=ratio,
                note=(
                    f"{'the default; ' if stop else ''}CPU time {best[f'cpu:{policy}']:.1f} "
                    f"us/step, x{cpu_ratio:.3f} of 'ignore'"
                ),
            )
        )
    return rows


def main() -> None:
    parser = make_parser(__doc__, quick_help="2000 steps, best of 3", repeats=5)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    args = parser.parse_args()
    apply_quick(parser, args, QUICK)
    if args.warmup % 50 or args.warmup < 50:
        parser.error("--warmup must be a positive multiple of 50")
    data = make_data(2, 4096)
    rows: list[dict[str, Any]] = []
    for backend in args.backends:
        best = bench_case(backend, data, args, print)
        rows += case_rows(backend, best, args)
    rows += core_rows(core_cost(args.repeats, print), args.repeats)
    print()
    print(f"{'case':40s} {'value':>10s} {'unit':>8s} {'x ignore':>9s}  note")
    for r in rows:
        print(f"{r['case']:40s} {r['value']:10.3f} {r['unit']:>8s} {r['ratio']:9.3f}  {r['note']}")
    if args.json:
        write_rows(args.json, rows)


if __name__ == "__main__":
    main()
