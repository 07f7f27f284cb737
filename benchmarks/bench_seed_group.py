"""Seeds in one program: a `SeedGroup` of S seeds against one seed's single run.

    uv run python benchmarks/bench_seed_group.py            # ~8 minutes on 2 CPU cores
    uv run python benchmarks/bench_seed_group.py --quick    # ~2 minutes

The network is APEBench's default emulator shape, `Conv;26;10;relu` (a periodic 1-D
conv net, 26 channels, 10 hidden convolutions; `pipekit_train.equinox.testing:
channels_first_conv`), on one-channel states of 160 points, batch 20, Adam: APEBench's
`diff_ks` cell. One `TrainingLoop` trains seed 0 alone; `SeedGroup(loop, seeds=[0..S-1])`
trains S seeds, either in one compiled step (`Equinox(group_step="vmap")`, `jax.vmap`
over the members) or each member's own step in turn (`"sequential"`, the CPU's default).
All run in this one process, taking turns, each timed from `run()` to its return
(compilation included) and at steady state (a run three times as long, minus the short
one). The target of issue 62: five seeds cost at most twice one seed's wall time.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _shared import make_parser, row, write_rows  # noqa: E402

N, CHANNELS, BATCH = 160, 1, 20


def _data(samples: int) -> Any:
    import numpy as np

    from pipekit_train.core import ArrayDataset

    rng = np.random.default_rng(0)
    x = rng.standard_normal((samples, N, CHANNELS)).astype(np.float32)
    y = np.roll(x, 1, axis=1) * 0.9
    return ArrayDataset(x=x, y=y)


class _Ticks:
    """The wall time at which each step ended (a callback of the single run)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def on_step_end(self, state: Any, metrics: Any) -> None:
        self.times.append(time.perf_counter())


def _loop(data: Any, updates: int, seed: int = 0, group_step: str = "auto") -> Any:
    from pipekit_train.core import TrainingLoop
    from pipekit_train.equinox import Equinox, EquinoxModelOp

    op = EquinoxModelOp(
        "pipekit_train.equinox.testing:channels_first_conv",
        num_spatial_dims=1,
        in_channels=CHANNELS,
        out_channels=CHANNELS,
        width=26,
        depth=10,
        activation="relu",
        layout="channels_last",
        seed=seed,
    )
    return TrainingLoop(
        op,
        data,
        optimizer_config={"name": "adam", "lr": 1e-4},
        batch_size=BATCH,
        max_steps=updates,
        seed=seed,
        progress=False,
        log_every_n_steps=max(1, updates),
        adapter=Equinox(group_step=group_step),
    )


def _time(fn: Any) -> float:
    # every run compiles its step: the single run's compiled steps are otherwise shared
    # across runs of one structure (the group's are its own)
    from pipekit_train.equinox import _compiled

    _compiled._CACHE.clear()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> int:
    parser = make_parser(__doc__)
    parser.add_argument("--seeds", type=int, default=5, help="members of the group (%(default)s)")
    parser.add_argument("--updates", type=int, default=None, help="updates per run")
    args = parser.parse_args()
    updates = args.updates or (100 if args.quick else 300)
    rounds = 1 if args.quick else 2
    from pipekit_train.core import SeedGroup

    data = _data(1000)
    seeds = list(range(args.seeds))
    modes = ("vmap", "sequential")
    walls: dict[str, list[float]] = {"single": [], **{m: [] for m in modes}}
    steady: dict[str, list[float]] = {"single": [], **{m: [] for m in modes}}

    def run(case: str, n: int) -> Any:
        if case == "single":
            return _loop(data, n).run()
        return SeedGroup(_loop(data, n, group_step=case), seeds=seeds).run()

    for case in walls:  # warm-up: the process's one-off costs go to no case
        _time(lambda case=case: run(case, 5))
    for _ in range(rounds):  # taking turns: machine noise hits every case
        for case in walls:
            short = _time(lambda case=case: run(case, updates))
            # steady state: the same run three times as long, minus the short one
            # (compilation and set-up cancel)
            long = _time(lambda case=case: run(case, 3 * updates))
            walls[case].append(short)
            steady[case].append(2 * updates / max(long - short, 1e-9))
    t1, s1 = min(walls["single"]), max(steady["single"])
    rows = [row("seed_group", "one seed, TrainingLoop", f"wall s ({updates} updates)", t1, "s")]
    rows.append(row("seed_group", "one seed, steady", "updates/s", s1, "updates/s"))
    print(f"Conv;26;10;relu, N={N}, batch {BATCH}, {updates} updates, best of {rounds}")
    print(f"  one seed (TrainingLoop):          {t1:7.2f} s  {s1:7.1f} updates/s steady")
    for mode in modes:
        ts, ss = min(walls[mode]), max(steady[mode])
        ratio, steady_ratio = ts / t1, s1 / ss
        rows.append(
            row(
                "seed_group",
                f"{len(seeds)} seeds, SeedGroup, group_step={mode!r}",
                f"wall s ({updates} updates), ratio to one seed",
                ts,
                "s",
                ratio=ratio,
                target="<= 2.0",
                ok=ratio <= 2.0,
            )
        )
        rows.append(
            row(
                "seed_group",
                f"{len(seeds)} seeds, steady, group_step={mode!r}",
                "group updates/s; ratio: one seed's step time to the group's",
                ss,
                "updates/s",
                ratio=steady_ratio,
            )
        )
        print(
            f"  {len(seeds)} seeds, group_step={mode!r}:{' ' * (11 - len(mode))}{ts:7.2f} s  "
            f"{ss:7.1f} group updates/s steady; wall {ratio:.2f}x one seed, a group step "
            f"{steady_ratio:.2f}x a single step (target <= 2.0: "
            f"{'ok' if ratio <= 2.0 else 'MISSED'})"
        )
    if args.json:
        write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
