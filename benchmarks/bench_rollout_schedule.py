"""A rollout schedule on Equinox and Keras (jax): each update's step chosen on the host,
against the on-device switch it replaced and the fixed-length steps (issue 32; not part of
the tests).

```bash
uv run python benchmarks/bench_rollout_schedule.py                 # 300 updates a case
uv run python benchmarks/bench_rollout_schedule.py --backend keras --updates 100
uv run python benchmarks/bench_rollout_schedule.py --quick --json /tmp/rs.json   # run_all
```

The field emulator's conv net (`examples/field_emulator.py`: 32×32 periodic grid, two
fields, width 16, depth 3) trained through its rollout on 8 simulated trajectories,
batches of 32, adam. Four cases, one after another in one process:

- `fixed k=2`: `Rollout(steps=2)`;
- `schedule at k=2 (host)`: `Rollout(steps=4, schedule={0: 2, 10**6: 4})`, so every
  timed update is at length 2; the library's path (the step compiled for length 2, chosen
  on the host from the step counter);
- `schedule at k=2 (switch)`: the same schedule with the backend's fixed-length steps
  removed (`EquinoxStepBackend._by_length = None`), so every update runs the step that picks
  its length on the device with a `lax.switch` over the four lengths (the path before the
  change, and still the one for fused updates that straddle a change of length);
- `fixed k=4`: `Rollout(steps=4)`.

On Keras (`KERAS_BACKEND=jax`, `examples/field_emulator.py`'s Keras conv net) the same
cases but the switch, which the Keras adapter no longer has: its train function holds
one jitted step per length and calls the one of each batch. Before that change the
Keras schedule picked the length with a `lax.switch` inside its one jitted step:
953 ms per update against 83.5 ms at fixed k=2 (11×, 100 updates, 2026-12-05). After
(quiet 2-core CPU): fixed k=2 55.0 / 67.1 ms, host 69.3 / 69.6 ms (1.26× / 1.04×), fixed
k=4 137.6 / 145.5 ms, at 100 / 200 updates; on one TPU v5e chip (`--updates 3000`: fewer
drown in the runs' set-up) 3.08, 4.03 and 4.12 ms (`benchmarks/tpu-check.md`).

Each case runs `TrainingLoop.run()` twice and times the second run (its compiled steps are
cached), wall clock over `--updates` updates, set-up included. The schedule's windows
carry 4 targets (the longest length), as `fixed k=4`'s do. Ratios are to `fixed k=2`;
target: the host-chosen step at most 1.2× `fixed k=2`.

Measured 2026-12-06 (quiet 2-core CPU, 300 updates): fixed k=2 83.7 ms, host 89.5 ms
(1.07×), switch 287.9 ms (3.44×), fixed k=4 156.0 ms (1.86×); on a loaded machine the
switch had cost 10× (665 against 57 ms). On one TPU v5e chip (the same cases, jax
0.10.2): 2.85, 4.03, 4.16 and 3.98 ms: there the switch costs little and the schedule's
larger batches (4 targets) dominate.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from _shared import make_parser, row, write_rows

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import field_emulator as fe  # noqa: E402

from pipekit_train.core import Rollout, TrainingLoop, TrajectoryWindows  # noqa: E402
from pipekit_train.core.data import Trajectories, fit_trajectory_normalizer  # noqa: E402

SCHEDULE = {0: 2, 10**6: 4}
TARGET = 1.2  # the host-chosen step against fixed k=2 (its windows carry 4 targets, not 2)


def cases(backend: str) -> list[tuple[str, Rollout, bool]]:
    """(label, rollout, with the on-device switch only) of one backend."""
    switch = [
        ("schedule at k=2 (switch)", Rollout(steps=4, residual=True, schedule=SCHEDULE), True)
    ]
    return [
        ("fixed k=2", Rollout(steps=2, residual=True), False),
        ("schedule at k=2 (host)", Rollout(steps=4, residual=True, schedule=SCHEDULE), False),
        *(switch if backend == "equinox" else []),
        ("fixed k=4", Rollout(steps=4, residual=True), False),
    ]


def time_case(
    backend_name: str, trajs: Trajectories, norm: Any, rollout: Rollout, switch: bool, n: int
) -> float:
    """Seconds per update of the second of two runs of `n` updates."""
    if not switch:
        return _time_runs(backend_name, trajs, norm, rollout, n)
    from pipekit_train.equinox import _step_backend

    backend = _step_backend.EquinoxStepBackend
    original = backend.__init__

    def switch_only(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self._by_length = None

    backend.__init__ = switch_only  # type: ignore[method-assign]
    try:
        return _time_runs(backend_name, trajs, norm, rollout, n)
    finally:
        backend.__init__ = original  # type: ignore[method-assign]


def _run_seconds(backend: str, trajs: Trajectories, norm: Any, rollout: Rollout, n: int) -> float:
    """Wall seconds of one `TrainingLoop.run()` of `n` updates."""
    loop = TrainingLoop(
        model=fe.model_op(backend),
        data=TrajectoryWindows(trajs, k=rollout.max_steps, targets="increments"),
        normalizer=norm,
        rollout=rollout,
        loss="mse",
        optimizer_config={"name": "adam", "lr": 1e-3},
        batch_size=32,
        max_steps=n,
        seed=0,
        progress=False,
    )
    start = time.perf_counter()
    loop.run()
    return time.perf_counter() - start


def _time_runs(backend: str, trajs: Trajectories, norm: Any, rollout: Rollout, n: int) -> float:
    """Seconds per update: Equinox, the second of two runs of `n` updates (its compiled
    steps are cached across runs); Keras compiles each run's model anew, so the
    difference between a run of `2n` and one of `n` updates, over `n`, after a first
    run of `n` (its one-time set-up, e.g. a TPU's, would otherwise land in the short one)."""
    if backend == "keras":
        _run_seconds(backend, trajs, norm, rollout, n)
        short = _run_seconds(backend, trajs, norm, rollout, n)
        return (_run_seconds(backend, trajs, norm, rollout, 2 * n) - short) / n
    _run_seconds(backend, trajs, norm, rollout, n)
    return _run_seconds(backend, trajs, norm, rollout, n) / n


def main() -> None:
    parser = make_parser(__doc__, quick_help="60 updates a case")
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument(
        "--backend", choices=["equinox", "keras", "both"], default="both", help="default: both"
    )
    args = parser.parse_args()
    n = 60 if args.quick else args.updates
    rng = np.random.default_rng(0)
    states = [fe.trajectory({"x0": fe.initial_state(rng).astype(np.float32)}) for _ in range(8)]
    trajs = Trajectories(np.stack(states))
    norm = fit_trajectory_normalizer(trajs, residual=True)
    backends = ["equinox", "keras"] if args.backend == "both" else [args.backend]
    rows = []
    for backend in backends:
        base = None
        for label, rollout, switch in cases(backend):
            per_update = time_case(backend, trajs, norm, rollout, switch, n)
            base = per_update if base is None else base
            print(
                f"{backend:>8} {label:>26}: {1e3 * per_update:8.2f} ms/update "
                f"({per_update / base:.2f}x)"
            )
            host = label == "schedule at k=2 (host)"
            rows.append(
                row(
                    "rollout-schedule",
                    f"{backend}: {label}",
                    f"ms per update, second of two runs of {n} updates (ratio: x fixed k=2)",
                    1e3 * per_update,
                    "ms",
                    ratio=per_update / base,
                    target=f"<= {TARGET}" if host else None,
                    ok=per_update / base <= TARGET if host else None,
                )
            )
    if args.json:
        write_rows(args.json, rows)


if __name__ == "__main__":
    main()
