"""`smc_sample` on sbibm's slcp: CPU seconds per observation and C2ST (issue 61, item 4).

```bash
uv run python benchmarks/bench_smc.py                       # observations 1-5, both samplers
uv run python benchmarks/bench_smc.py --observations 1 --no-c2st --nle   # timing only
```

For each observation, 10 000 draws (`--n`) of slcp's posterior by `smc_sample` on the
task's EXACT likelihood (`sbi_nle.slcp_log_likelihood`, seed = the observation), with
the mixture kernel (`new`: `kernel="mixture"` and its defaults, `ess=0.5`, 4 moves a
stage, 8 final moves, 32 groups) and with the default random walk (`old`:
`kernel="walk"`, `ess=0.9, moves=20, final_moves=40, clusters=8`), side by side in one run: CPU seconds
(`time.process_time`, one thread), likelihood calls, and the C2ST of the draws against
sbibm's 10 000 reference draws (`diagnostics.c2st`, sbibm's settings, seed = the
observation; `--jobs` processes).

`--nle` also times both samplers on a stand-in for a trained NLE network of
`bench_sbi.py --estimator nle --nle-points`' size: an MLP 5 → 128 → 128 →
`flow_width(2, 5, 8)` (numpy, float32, random weights) whose output is core's `Flow`
(5 layers, 8 bins) scored at the observation's four points, added (× 1e-6) to the exact
log-likelihood, so that the tempering path, and the number of calls, are the exact
likelihood's while each call costs what a real network's does (0.17 s per 10 000 rows on
the 2-core development machine). The time inside these calls is the floor of an NLE
run; the rest is the sampler's own.

Takes about 6 minutes for five observations on the 2-core development machine (the
C2STs, 30 s each, dominate; the old sampler about 3 s per observation on the exact
likelihood, the new 1 s; with `--nle` add 90 s and 8 s per observation).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sbi_nle  # noqa: E402
from sbi_tasks import get_task  # noqa: E402

from pipekit_train.core import losses, smc_sample  # noqa: E402
from pipekit_train.core.distributions import Flow  # noqa: E402

#: The default random walk (its defaults, spelled out) and the mixture kernel.
OLD = {"kernel": "walk", "ess": 0.9, "moves": 20, "final_moves": 40, "clusters": 8}
SAMPLERS = {"old": OLD, "new": {"kernel": "mixture"}}


def standin_nle(x_o: np.ndarray, seed: int = 0):
    """A likelihood network's cost without training one: MLP + `Flow` over 4 points."""
    rng = np.random.default_rng(seed)
    sizes = [5, 128, 128, losses.flow_width(2, 5, 8)]
    weights = [
        rng.normal(0, 1 / np.sqrt(a), (a, b)).astype(np.float32)
        for a, b in zip(sizes[:-1], sizes[1:], strict=True)
    ]
    weights[-1] *= 0.1
    points = np.asarray(x_o, dtype=np.float64).reshape(4, 2)
    exact = sbi_nle.slcp_log_likelihood(x_o)

    def log_q(theta: np.ndarray) -> np.ndarray:
        h = np.asarray(theta, dtype=np.float32) / 3.0
        for i, w in enumerate(weights):
            h = h @ w if i == len(weights) - 1 else np.maximum(h @ w, 0.0)
        flow = Flow(h, flow_layers=5, flow_bins=8, flow_bound=3.0, scale=np.full(2, 5.0))
        network = flow.log_prob(points[:, None]).sum(axis=0)
        # the untrained network is nearly flat: the exact likelihood sets the path (stages)
        return exact(theta) + 1e-6 * network

    return log_q


def timed_run(log_likelihood, k: int, options: dict) -> tuple[np.ndarray, float, float, int]:
    """Draws, CPU seconds in all, CPU seconds inside the likelihood, likelihood calls."""
    spent = [0.0]

    def counted(theta: np.ndarray) -> np.ndarray:
        started = time.process_time()
        out = log_likelihood(theta)
        spent[0] += time.process_time() - started
        return out

    task, info = get_task("slcp"), {}
    started = time.process_time()
    draws = smc_sample(counted, sbi_nle.box(task), ARGS.n, seed=k, info=info, **options)
    return draws, time.process_time() - started, spent[0], info["calls"]


def c2st_job(job: tuple[int, np.ndarray]) -> float:
    from pipekit_train.core import diagnostics

    k, draws = job
    reference = get_task("slcp").reference(k)[: len(draws)]
    return diagnostics.c2st(reference, draws, seed=k, folds=5)


def main() -> None:
    task = get_task("slcp")
    rows, jobs = [], []
    for k in ARGS.observations:
        x_o = task.observation(k)
        for name, options in SAMPLERS.items():
            draws, cpu, inside, calls = timed_run(sbi_nle.slcp_log_likelihood(x_o), k, options)
            row = {"k": k, "sampler": name, "cpu": cpu, "sampler_cpu": cpu - inside, "calls": calls}
            if ARGS.nle:
                _, nle_cpu, nle_inside, _ = timed_run(standin_nle(x_o), k, options)
                row.update(nle_cpu=nle_cpu, nle_floor=nle_inside)
            rows.append(row)
            jobs.append((k, draws))
            print(f"  observation {k}, {name}: {cpu:.2f} s CPU, {calls} calls", flush=True)
    if ARGS.c2st:
        with ProcessPoolExecutor(ARGS.jobs) as pool:
            for row, score in zip(rows, pool.map(c2st_job, jobs), strict=True):
                row["c2st"] = score
    head = "| obs | sampler | calls | exact: CPU s (sampler's own) | C2ST |"
    if ARGS.nle:
        head += " NLE stand-in: CPU s (network's floor) |"
    print("\n" + head)
    print("|---" * (head.count("|") - 1) + "|")
    for row in rows:
        line = (
            f"| {row['k']} | {row['sampler']} | {row['calls']} | {row['cpu']:.2f} "
            f"({row['sampler_cpu']:.2f}) | {row.get('c2st', float('nan')):.4f} |"
        )
        if ARGS.nle:
            line += f" {row['nle_cpu']:.1f} ({row['nle_floor']:.1f}) |"
        print(line)
    for name in SAMPLERS:
        mine = [r for r in rows if r["sampler"] == name]
        mean = {key: np.mean([r[key] for r in mine]) for key in mine[0] if key not in ("sampler",)}
        print(f"mean {name}: " + ", ".join(f"{key} {v:.3f}" for key, v in mean.items()))
    old = [r for r in rows if r["sampler"] == "old"]
    new = [r for r in rows if r["sampler"] == "new"]
    ratio = np.mean([o["cpu"] / m["cpu"] for o, m in zip(old, new, strict=True)])
    print(f"old / new CPU seconds on the exact likelihood: {ratio:.1f}x")
    if ARGS.nle:
        ratio = np.mean([o["nle_cpu"] / m["nle_cpu"] for o, m in zip(old, new, strict=True)])
        print(f"old / new CPU seconds on the NLE stand-in: {ratio:.1f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--observations", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=2, help="processes for the C2STs")
    parser.add_argument("--c2st", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--nle", action="store_true", help="also time the NLE stand-in")
    ARGS = parser.parse_args()
    main()
