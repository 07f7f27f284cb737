"""`Flow` with several values per flow: each flow's parameters once, or a copy per value.

```bash
uv run python benchmarks/bench_flow.py
uv run python benchmarks/bench_flow.py --quick --json /tmp/flow.json   # run_all convention
```

A flow head's `Flow` evaluates its spline knots from the network output. When one flow
scores several values (i.i.d. points of one observation in `LikelihoodPosterior`, the
draws of `sample`, `mean` and `acceptance`), `Flow` passes each flow's parameters once,
`(rows, 1, width)`, against all its values with `flow_log_prob(..., broadcast=True)`.
The reference is what it did before: a copy of the parameters per value (gathered in
chunks of the same size), then the same `flow_log_prob`.

Cases (slcp's NLE head: 5 layers, 8 bins, 2 values): `log_prob` of 4 and 16 points under
each of 10 000 flows (one SMC likelihood call), and 2000 draws from each of 16 flows.
Both sides run interleaved, best of `--repeats`. The rows check that both give the same
numbers (bit for bit) and report the speed-up; the target is on the 4-point case.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _shared import apply_quick, make_parser, row, write_rows

from pipekit_train.core import Flow, losses
from pipekit_train.core.distributions import _flow

OPTS = {"flow_layers": 5, "flow_bins": 8}
QUICK = {"flows": 2000, "repeats": 3}
TARGET = 1.5  # the per-flow path at least this much faster for 4 points per flow

result = functools.partial(row, "flow", digits=4)


def copies(flow: Flow, fn: Callable[..., Any], values: np.ndarray) -> np.ndarray:
    """The reference: `fn` on a copy of each value's flow parameters, in chunks."""
    width = flow.params.shape[-1]
    table = flow.params.reshape(-1, width)
    index = np.broadcast_to(np.arange(len(table)), values.shape[:-1]).reshape(-1)
    flat = values.reshape(-1, flow.dim)
    step = max(1, _flow._CHUNK // width)
    parts = [
        fn(table[index[i : i + step]], flat[i : i + step], **flow.options)
        for i in range(0, len(flat), step)
    ]
    return np.concatenate(parts).reshape((*values.shape[:-1], *parts[0].shape[1:]))


def best(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


def main() -> None:
    parser = make_parser(__doc__, quick_help="2000 flows, best of 3", repeats=5)
    parser.add_argument("--flows", type=int, default=10_000, help="flows in the batch")
    args = parser.parse_args()
    apply_quick(parser, args, QUICK)
    rng = np.random.default_rng(0)
    width = losses.flow_width(2, **OPTS)
    rows = []

    def case(name: str, flow: Flow, ours: Callable[[], Any], ref: Callable[[], Any]) -> None:
        t_ref = t_ours = float("inf")
        for _ in range(args.repeats):  # interleaved
            a, out_ref = best(ref, 1)
            b, out_ours = best(ours, 1)
            t_ref, t_ours = min(t_ref, a), min(t_ours, b)
        same = bool(np.array_equal(out_ref, out_ours))
        speedup = t_ref / t_ours
        target = f">= {TARGET}" if "4 points" in name else None
        ok = (same and speedup >= TARGET) if target else same
        rows.append(result(name, "per flow, best of repeats", t_ours, "s", ratio=speedup,
                           target=target, ok=ok,
                           note=f"a copy per value: {t_ref:.4f} s; same numbers: {same}"))  # fmt: skip
        print(f"{name:45s} per flow {t_ours:.4f} s  copies {t_ref:.4f} s  "
              f"x{speedup:.2f}  same: {same}")  # fmt: skip

    flows = Flow(0.3 * rng.normal(size=(args.flows, width)), **OPTS)
    for k in (4, 16):
        points = rng.normal(size=(k, 1, 2))
        values = np.broadcast_to(points, (k, args.flows, 2))
        case(
            f"log_prob, {k} points x {args.flows} flows",
            flows,
            lambda v=values: flows.log_prob(v),
            lambda v=values: copies(flows, losses.flow_log_prob, v),
        )
    few = flows[:16]
    z = rng.standard_normal((2000, 16, 2))
    case(
        "inverse (sample), 2000 draws x 16 flows",
        few,
        lambda: few._chunked(losses.flow_inverse, z),
        lambda: copies(few, losses.flow_inverse, z),
    )
    if args.json:
        write_rows(args.json, rows)


if __name__ == "__main__":
    main()
