"""Side-by-side benchmark of the Equinox adapter (not part of the test run).

    uv run python benchmarks/bench_equinox.py                       # full run (a few minutes)
    uv run python benchmarks/bench_equinox.py --repeats 5 --rss-steps 50000
    uv run python benchmarks/bench_equinox.py --quick --json /tmp/equinox.json   # run_all convention

`--quick` runs the same cases best of 2, with 30% of the warm-up and timed steps
(`--steps-scale 0.3`, rounded to multiples of 50) and a 4000-step RSS run. Explicit
`--repeats`, `--steps-scale` and `--rss-steps` win over `--quick`.

Three loops train the same model (same initial weights, adam lr 1e-3, mse) on the same
batches — every loop draws numpy batches from core's batching engine (`make_batches`),
none is pre-staged on the device:

- `adapter`: `TrainingLoop(..., adapter=Equinox(...)).run()`, i.e. core's step driver,
  `RunContext` (metrics buffered on the device and fetched every 50 steps, history,
  writers) and the adapter's compiled step.
- `filter_jit`: the usual hand-written loop, `eqx.filter_jit` step + optax.
- `jit`: a hand-written `jax.jit` step over `eqx.partition`ed arrays with donation.

What is measured: steps/s after warm-up (compilation excluded). For the adapter, a
writer records `time.perf_counter()` when the metrics of step `warmup` are flushed
and when the last step is flushed (metrics are fetched in groups of 50, each fetch
waits for the device), so the interval covers exactly steps `warmup+1 .. total`,
including batching, dispatch and logging. The hand-written loops are timed over the
same steps and end with `jax.block_until_ready`. Each measurement is repeated (runs
interleaved, so machine noise hits all sides alike) and the best rate is kept.

Cases: (a) MLP 8→256→256→1, batch 256; (b) MLP 2→32→1, batch 32; (c) (b) with
`steps_per_execution=10` (against the per-step loops). Last, the peak RSS of a long
run of (a) at 10% and at 100% of its steps (it must not grow).

Rows follow the convention in `benchmarks/run_all.py`. In (a) and (b) each row's `ratio`
is relative to the faster of the two hand-written loops (`filter_jit`, `jit`), and the
adapter's target is >= 0.95. In (c) the reference is the per-step `filter_jit` loop and
the target >= 5. The RSS row's ratio is the peak RSS at the end over the peak RSS at 10%
of the steps, with target <= 1.02 ("must not grow", allowing allocator noise and core's
metric history of about 70 B a step).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from _shared import Clock, apply_quick, make_data, make_parser, mlp_op, row, write_rows

from pipekit_train.core import TrainingLoop
from pipekit_train.core.data import ArrayDataset, make_batches
from pipekit_train.equinox import Equinox, EquinoxModelOp

LR = 1e-3
SEED = 0
QUICK = {"repeats": 2, "steps_scale": 0.3, "rss_steps": 4_000}
LOOPS = {
    "adapter": "adapter (TrainingLoop.run)",
    "filter_jit": "filter_jit loop",
    "jit": "jax.jit loop",
    "jit_prestaged": "jax.jit loop, batches pre-staged on the device",
}


def make_op(in_size: int, width: int, depth: int) -> EquinoxModelOp:
    """The benchmark MLP as a model operator (ReLU, `eqx.nn.MLP`)."""
    return mlp_op("equinox", in_size, width, depth, seed=SEED, activation="relu")


# -- the adapter ---------------------------------------------------------------------------
def run_adapter(
    data: ArrayDataset, op: EquinoxModelOp, batch: int, warmup: int, total: int, k: int = 1
) -> tuple[float, Clock]:
    """Steps/s of `TrainingLoop.run()` over steps `warmup+1 .. total`; its clock (a metric
    writer: it reads itself when the metrics of steps `warmup` and `total` are flushed)."""
    clock = Clock(warmup, total)
    TrainingLoop(
        model=op,
        data=data,
        loss="mse",
        optimizer_config={"name": "adam", "lr": LR},
        batch_size=batch,
        max_steps=total,
        seed=SEED,
        adapter=Equinox(steps_per_execution=k),
        writers=[clock],
        log_every_n_steps=50,
        progress=False,
    ).run()
    return clock.rate(), clock


# -- hand-written loops --------------------------------------------------------------------
def _loss(model: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def run_filter_jit(
    data: ArrayDataset, op: EquinoxModelOp, batch: int, warmup: int, total: int
) -> float:
    """The usual loop: `eqx.filter_jit` + `eqx.filter_value_and_grad` + optax."""
    optim = optax.adam(LR)
    model = op.model
    opt_state = optim.init(eqx.filter(model, eqx.is_array))

    @eqx.filter_jit
    def step(model: Any, opt_state: Any, x: jax.Array, y: jax.Array) -> tuple[Any, Any, jax.Array]:
        loss, grads = eqx.filter_value_and_grad(_loss)(model, x, y)
        updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state, loss

    it = make_batches(data, batch, seed=SEED)
    t0 = 0.0
    for i in range(total):
        if i == warmup:
            jax.block_until_ready(model)
            t0 = time.perf_counter()
        b = next(it)
        model, opt_state, loss = step(model, opt_state, b["x"], b["y"])
    jax.block_until_ready((model, loss))
    return (total - warmup) / (time.perf_counter() - t0)


def run_jit(
    data: ArrayDataset,
    op: EquinoxModelOp,
    batch: int,
    warmup: int,
    total: int,
    staged: bool = False,
) -> float:
    """`jax.jit` over `eqx.partition`ed arrays, model and optimizer state donated."""
    optim = optax.adam(LR)
    params, static = eqx.partition(op.model, eqx.is_array)
    params = jax.tree.map(jnp.copy, params)
    opt_state = optim.init(params)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params: Any, opt_state: Any, x: jax.Array, y: jax.Array) -> tuple[Any, Any, jax.Array]:
        loss, grads = jax.value_and_grad(lambda p: _loss(eqx.combine(p, static), x, y))(params)
        updates, opt_state = optim.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    it = make_batches(data, batch, seed=SEED)
    staged_batches = [jax.device_put(next(it)) for _ in range(total)] if staged else None
    t0 = 0.0
    for i in range(total):
        if i == warmup:
            jax.block_until_ready(params)
            t0 = time.perf_counter()
        b = staged_batches[i] if staged_batches is not None else next(it)
        params, opt_state, loss = step(params, opt_state, b["x"], b["y"])
    jax.block_until_ready((params, loss))
    return (total - warmup) / (time.perf_counter() - t0)


def best(fn: Callable[[], float], results: list[float]) -> None:
    results.append(fn())


def bench_case(
    name: str,
    in_size: int,
    width: int,
    depth: int,
    batch: int,
    warmup: int,
    total: int,
    repeats: int,
    k: int = 1,
) -> dict[str, float]:
    """Interleaved best-of-`repeats` steps/s of the three loops for one case."""
    data = make_data(in_size, rows=max(batch * 64, 4096))
    op = make_op(in_size, width, depth)
    rates: dict[str, list[float]] = {
        "adapter": [],
        "filter_jit": [],
        "jit": [],
        "jit_prestaged": [],
    }
    for _ in range(repeats):
        rates["adapter"].append(run_adapter(data, op, batch, warmup, total, k)[0])
        rates["filter_jit"].append(run_filter_jit(data, op, batch, warmup, total))
        rates["jit"].append(run_jit(data, op, batch, warmup, total))
        rates["jit_prestaged"].append(run_jit(data, op, batch, warmup, total, staged=True))
    out = {key: max(v) for key, v in rates.items()}
    faster = max(out["filter_jit"], out["jit"])
    print(
        f"\n({name}) MLP {in_size}→{'→'.join([str(width)] * depth)}→1, batch {batch}, steps_per_execution={k}; "
        f"steps {warmup + 1}..{total}, best of {repeats}"
    )
    for key, rate in out.items():
        extra = "" if key == "adapter" else f"   adapter/{key} = {out['adapter'] / rate:.2f}x"
        print(f"  {key:<14} {rate:>10.0f} steps/s{extra}")
    print(f"  adapter / faster hand-written loop (same batching) = {out['adapter'] / faster:.2f}x")
    return out


# One result row of this benchmark (see _shared.row): value to 1 decimal, ratio to 3.
result = functools.partial(row, "equinox", digits=1)


def case_rows(
    label: str,
    out: dict[str, float],
    steps: tuple[int, int],
    repeats: int,
    *,
    reference: str | None,
    target: float,
) -> list[dict[str, Any]]:
    """Rows of one case; `reference` is a loop's key, or None for the faster hand-written one."""
    faster = max(("filter_jit", "jit"), key=lambda key: out[key])
    ref_key = reference or faster
    ref_name = (
        f"per-step {LOOPS[ref_key]}"
        if reference
        else f"faster hand-written loop ({LOOPS[ref_key]})"
    )
    metric = f"steps/s, steps {steps[0] + 1}..{steps[1]}, best of {repeats} (ratio: x {ref_name})"
    rows = []
    for key, rate in out.items():
        adapter = key == "adapter"
        rows.append(
            result(
                f"{label}: {LOOPS[key]}",
                metric,
                rate,
                "steps/s",
                ratio=rate / out[ref_key],
                target=f">= {target:g}" if adapter else None,
                ok=out["adapter"] >= target * out[ref_key] if adapter else None,
                note=None if adapter else f"adapter / this loop = {out['adapter'] / rate:.2f}x",
            )
        )
    return rows


def main() -> None:
    parser = make_parser(
        __doc__,
        quick_help="best of 2, 30%% of the steps, a 4000-step RSS run (explicit values win)",
        repeats=3,
    )
    parser.add_argument(
        "--steps-scale",
        type=float,
        default=1.0,
        help="scale the warm-up and timed steps of each case (rounded to multiples of 50)",
    )
    parser.add_argument("--rss-steps", type=int, default=20_000)
    parser.add_argument("--skip-rss", action="store_true")
    args = parser.parse_args()
    apply_quick(parser, args, QUICK)

    def steps(n: int) -> int:
        # multiples of 50: the adapter's metrics are flushed (and timestamped) every 50 steps
        return max(50, round(n * args.steps_scale / 50) * 50)

    print(
        f"jax {jax.__version__}, equinox {eqx.__version__}, optax {optax.__version__}, devices {jax.devices()}"
    )
    steps_a, steps_bc = (steps(100), steps(1100)), (steps(200), steps(3200))
    a = bench_case("a", 8, 256, 2, 256, *steps_a, repeats=args.repeats)
    b = bench_case("b", 2, 32, 1, 32, *steps_bc, repeats=args.repeats)
    c = bench_case("c", 2, 32, 1, 32, *steps_bc, repeats=args.repeats, k=10)
    rows = [
        *case_rows(
            "(a) MLP 8→256→256→1, batch 256", a, steps_a, args.repeats, reference=None, target=0.95
        ),
        *case_rows(
            "(b) MLP 2→32→1, batch 32", b, steps_bc, args.repeats, reference=None, target=0.95
        ),
        *case_rows(
            "(c) MLP 2→32→1, batch 32, adapter steps_per_execution=10",
            c,
            steps_bc,
            args.repeats,
            reference="filter_jit",
            target=5,
        ),
    ]
    print("\nTargets:")
    print(
        f"  (a) adapter >= 0.95x faster hand-written: {a['adapter'] / max(a['filter_jit'], a['jit']):.2f}x"
    )
    print(
        f"  (b) adapter >= 0.95x faster hand-written: {b['adapter'] / max(b['filter_jit'], b['jit']):.2f}x"
    )
    print(f"  (c) adapter K=10 >= 5x per-step filter_jit: {c['adapter'] / c['filter_jit']:.2f}x")
    if not args.skip_rss:
        n = args.rss_steps
        data = make_data(8, rows=256 * 64)
        rate, clock = run_adapter(data, make_op(8, 256, 2), 256, n // 10, n)
        lo, hi = clock.rss[n // 10], clock.rss[n]
        print(
            f"\nPeak RSS of a {n}-step run of (a): {lo / 1024:.1f} MiB at step {n // 10}, "
            f"{hi / 1024:.1f} MiB at step {n} (growth {(hi - lo) / 1024:.1f} MiB); {rate:.0f} steps/s"
        )
        rows.append(
            result(
                f"(a) {n}-step run: peak RSS",
                f"peak RSS at step {n} (ratio: x peak RSS at step {n // 10})",
                hi / 1024,
                "MiB",
                ratio=hi / lo,
                target="<= 1.02",
                ok=hi <= 1.02 * lo,
                note=(
                    f"{lo / 1024:.1f} MiB at step {n // 10}, growth {(hi - lo) / 1024:.1f} MiB; "
                    f"{rate:.0f} steps/s"
                ),
            )
        )
    else:
        rows.append(
            result("(a) long run: peak RSS", "not measured", None, "MiB", note="--skip-rss")
        )
    if args.json:
        write_rows(args.json, rows)


if __name__ == "__main__":
    main()
