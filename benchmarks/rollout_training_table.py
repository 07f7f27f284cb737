"""The honest table of rollout training: five settings at equal numbers of updates, on the
chaotic example (Lorenz-96), on the field emulator (Gray–Scott) over 400 steps and on the
oscillator emulator.

```bash
uv run python benchmarks/rollout_training_table.py                    # both problems, 3 seeds
uv run python benchmarks/rollout_training_table.py --problem lorenz96 --seeds 0
uv run python benchmarks/rollout_training_table.py --quick            # a smoke run (seconds)
uv run python benchmarks/rollout_training_table.py --log runs.jsonl     # keep each run
uv run python benchmarks/rollout_training_table.py --table-from a.jsonl b.jsonl --markdown t.md
```

Settings, all with the library's Equinox rollout training (`TrainingLoop(rollout=...)`),
the same model, data, optimizer (Adam, warm-up cosine), batch size and number of updates:

- `one-step`: ordinary training on one-step increments (`rollout=None`, windows of k = 1);
- `k=4`: `Rollout(steps=4, residual=True)`, full backpropagation through the 4 steps;
- `curriculum 1→4`: the same with `RolloutSchedule(start=1, every_n_steps=updates // 5,
  maximum=4)` (k = 1, 2, 3 for a fifth of the updates each, then 4);
- `pushforward`: `Rollout(steps=4, backprop="last")` (3 steps without gradient, the last
  trained);
- `input noise`: one step with Gaussian noise on the input state (`Rollout(steps=1,
  noise_std=...)`, the target stays the true next state, so the model learns to correct
  the noise; 0.01 normalised units, about the size of the one-step error).

None of these was tuned: the settings were fixed before the first run. Each trained model
is rolled out from held-out trajectories (never seen in training) with `NeuralForward`
(`rollout_validation`), and the table reports the nRMSE (RMSE over the target's root mean
square, The Well's definition; per field, averaged over fields) at lead 1 and at one and
two Lyapunov times (Lorenz-96: 13 and 26 steps of 0.05 time units, `lorenz96.LYAPUNOV_TIME`
= 0.64 time units, measured with that simulator) or at 50, 200 and 400 steps (Gray–Scott),
the valid prediction time (the time until the nRMSE first exceeds a threshold fixed in
advance: 0.5 for Lorenz-96, in Lyapunov times; 0.2 for Gray–Scott, in emulator steps),
and the training time (wall clock of `TrainingLoop.run`, compilation included). Values
are the mean ± the spread (half the range) over the seeds (model initialisation and batch
order).

Problems:

- `lorenz96`: 20 variables, F = 8; 64 training trajectories of 200 steps (the normaliser
  is fitted on them; no validation set is used), 16 held-out trajectories rolled out 60
  steps from 3 starts each; an MLP 20 → 128 → 128 → 20 (tanh); 3000 updates of batch 64.
- `oscillator`: the emulator example's damped oscillator (`examples/emulator.py`,
  `toymodels.oscillator_step`: ω = 2 rad/s, ζ = 0.1, Δt = 0.1 s) and its MLP 2 → 64 → 64
  → 2 (tanh); 160 training trajectories of 50 steps from states uniform in [-1, 1]²
  (8160 states, about the example's 8192), 16 held-out ones rolled out 50 steps from
  states uniform in [-0.9, 0.9]² (the example's rollout); 3000 updates of batch 128
  (the example's); VPT threshold nRMSE 0.05, in steps.
- `gray_scott`: the field emulator's simulator and conv net (`examples/field_emulator.py`,
  32×32, width 16, depth 3); 24 training trajectories of 400 emulator steps from the
  example's random initial states (windows cover the whole 400 steps), 6 held-out
  trajectories rolled out 400 steps from step 10; 1000 updates of batch 8 (a twelfth of
  the example's 3000 × 32, so that the table fits in about half an hour on two cores).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import field_emulator as fe  # noqa: E402
import lorenz96  # noqa: E402
import toymodels  # noqa: E402
from rollout_settings import SETTINGS, rollout_setting, window_length  # noqa: E402

from pipekit_train.core import (  # noqa: E402
    NeuralForward,
    TrainingLoop,
    TrajectoryWindows,
    rollout_validation,
)
from pipekit_train.core.data import Trajectories, fit_trajectory_normalizer  # noqa: E402

PROBLEMS: dict[str, dict[str, Any]] = {
    "lorenz96": {
        "n_train": 64,
        "train_steps": 200,
        "n_test": 16,
        "horizon": 60,
        "starts": (0, 60, 120),
        "updates": 3000,
        "batch_size": 64,
        "lr": 2e-3,
        "leads": (1, 13, 26),
        "lead_names": ("lead 1", "1 Lyapunov time (13)", "2 Lyapunov times (26)"),
        "vpt_threshold": 0.5,
    },
    "gray_scott": {
        "n_train": 24,
        "train_steps": 400,
        "n_test": 6,
        "horizon": 400,
        "starts": (0,),
        "updates": 1000,
        "batch_size": 8,
        "lr": 3e-3,
        "leads": (1, 50, 200, 400),
        "lead_names": ("lead 1", "50 steps", "200 steps", "400 steps"),
        "vpt_threshold": 0.2,
    },
}
PROBLEMS["oscillator"] = {
    "n_train": 160,
    "train_steps": 50,
    "n_test": 16,
    "horizon": 50,
    "starts": (0,),
    "updates": 3000,
    "batch_size": 128,
    "lr": 3e-3,
    "leads": (1, 10, 25, 50),
    "lead_names": ("lead 1", "10 steps", "25 steps", "50 steps"),
    "vpt_threshold": 0.05,
    "digits": 2,  # errors below 1%
}
QUICK = {"updates": 30, "n_train": 4, "n_test": 2, "train_steps": 40}


def lorenz96_data(cfg: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Training and held-out trajectories `(n, T + 1, 20)` from disjoint seeds."""
    train = lorenz96.trajectories(cfg["n_train"], cfg["train_steps"], seed=1)
    test_steps = max(cfg["starts"]) + cfg["horizon"]
    test = lorenz96.trajectories(cfg["n_test"], test_steps, seed=2)
    return train, test


def gray_scott_trajectories(n: int, n_steps: int, seed: int, skip: int = 0) -> np.ndarray:
    """`n` trajectories `(n, n_steps + 1, 32, 32, 2)` of the field emulator's simulator from
    its random initial states (drawn from `seed`), after `skip` emulator steps."""
    rng = np.random.default_rng(seed)
    state = np.stack([fe.initial_state(rng) for _ in range(n)])
    state = fe.gray_scott(state, skip * fe.INNER)
    out = np.empty((n, n_steps + 1, *state.shape[1:]), dtype=np.float32)
    out[:, 0] = state
    for t in range(n_steps):
        state = fe.gray_scott(state)
        out[:, t + 1] = state
    return out


def gray_scott_data(cfg: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Training trajectories from step 0 and held-out ones from step `fe.START`."""
    train = gray_scott_trajectories(cfg["n_train"], cfg["train_steps"], seed=1)
    test = gray_scott_trajectories(cfg["n_test"], cfg["horizon"], seed=2, skip=fe.START)
    return train, test


def oscillator_trajectories(n: int, n_steps: int, seed: int, bound: float) -> np.ndarray:
    """`n` trajectories `(n, n_steps + 1, 2)` of the emulator example's damped oscillator
    (`toymodels.oscillator_step`) from states uniform in `[-bound, bound]²`."""
    state = np.random.default_rng(seed).uniform(-bound, bound, size=(n, 2))
    out = np.empty((n, n_steps + 1, 2), dtype=np.float32)
    out[:, 0] = state
    for t in range(n_steps):
        state = toymodels.oscillator_step(state)
        out[:, t + 1] = state
    return out


def oscillator_data(cfg: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Training trajectories from `[-1, 1]²` and held-out ones from `[-0.9, 0.9]²` (the
    example's sampler and its held-out initial states), from disjoint seeds."""
    train = oscillator_trajectories(cfg["n_train"], cfg["train_steps"], seed=1, bound=1.0)
    test = oscillator_trajectories(cfg["n_test"], cfg["horizon"], seed=2, bound=0.9)
    return train, test


DATA = {"lorenz96": lorenz96_data, "gray_scott": gray_scott_data, "oscillator": oscillator_data}


def model_op(problem: str, seed: int) -> Any:
    """The problem's model (Equinox)."""
    from pipekit_train.equinox import EquinoxModelOp

    if problem == "oscillator":
        return toymodels.model_op("equinox", in_size=2, out_size=2, width=64, seed=seed)

    if problem == "lorenz96":
        return EquinoxModelOp(
            "pipekit_train.equinox.testing:mlp",
            in_size=lorenz96.N,
            out_size=lorenz96.N,
            width=128,
            depth=2,
            seed=seed,
        )
    return fe.model_op("equinox", width=16, depth=3, seed=seed)


def train_one(
    problem: str, setting: str, seed: int, train: np.ndarray, normalizer: Any, cfg: dict[str, Any]
) -> tuple[Any, float]:
    """Train one setting; the trained model op and the wall time of `run()`."""
    rollout = rollout_setting(setting, cfg["updates"])
    windows = TrajectoryWindows(train, k=window_length(rollout), targets="increments")
    updates = cfg["updates"]
    loop = TrainingLoop(
        model=model_op(problem, seed),
        data=windows,
        normalizer=normalizer,
        rollout=rollout,
        loss="mse",
        optimizer_config={
            "name": "adam",
            "lr": {
                "schedule": "warmup_cosine",
                "init_value": 0.0,
                "peak_value": cfg["lr"],
                "warmup_steps": max(1, updates // 20),
                "decay_steps": updates,
                "end_value": cfg["lr"] / 100,
            },
        },
        batch_size=cfg["batch_size"],
        max_steps=updates,
        seed=seed,
        progress=False,
    )
    start = time.perf_counter()
    artifact = loop.run()
    return artifact.model, time.perf_counter() - start


def evaluate(
    problem: str, model: Any, normalizer: Any, test: np.ndarray, cfg: dict[str, Any]
) -> dict[str, float]:
    """nRMSE at the problem's leads and the valid prediction time of one trained model."""
    grid = problem == "gray_scott"
    forward = NeuralForward(model, normalizer, residual=True, state_ndim=3 if grid else 1)
    dt = _time_unit(problem)
    report = rollout_validation(
        forward,
        test,
        cfg["horizon"],
        starts=cfg["starts"],
        spatial_ndim=2 if grid else 0,
        per_channel=grid,
        dt=dt,
    )
    return _scores(report, cfg)


def _time_unit(problem: str) -> float:
    """One emulator step in the unit of the problem's valid time (Lyapunov times or steps)."""
    return lorenz96.EMULATOR_DT / lorenz96.LYAPUNOV_TIME if problem == "lorenz96" else 1.0


def _scores(report: Any, cfg: dict[str, Any]) -> dict[str, float]:
    per_lead = np.asarray(report.errors["nrmse"]).mean(axis=-1)  # (H,): mean over fields
    leads = zip(cfg["lead_names"], cfg["leads"], strict=True)
    out = {name: float(per_lead[lead - 1]) for name, lead in leads}
    out["vpt"] = float(report.valid_prediction_time(cfg["vpt_threshold"]))
    return out


def persistence(problem: str, test: np.ndarray, cfg: dict[str, Any]) -> dict[str, float]:
    """The same scores for persistence (the state held constant): the floor to beat."""
    grid = problem == "gray_scott"
    report = rollout_validation(
        lambda s: s,
        test,
        cfg["horizon"],
        starts=cfg["starts"],
        spatial_ndim=2 if grid else 0,
        per_channel=grid,
        dt=_time_unit(problem),
    )
    return _scores(report, cfg)


def run_problem(
    problem: str, seeds: list[int], settings: list[str], quick: bool, log: Path | None = None
) -> dict:
    """Every setting × seed of one problem (seed by seed): raw results per run.

    With `log`, each finished run (and first the problem's set-up) is appended to that
    JSON-lines file, so an interrupted run keeps what it finished (`--table-from`).
    """
    cfg = dict(PROBLEMS[problem])
    if quick:
        cfg.update(QUICK)
        cfg["horizon"] = min(cfg["horizon"], 30)
        cfg["starts"] = (0,)
        cfg["leads"] = tuple(min(lead, cfg["horizon"]) for lead in cfg["leads"])
    t0 = time.perf_counter()
    train, test = DATA[problem](cfg)
    simulate_s = time.perf_counter() - t0
    normalizer = fit_trajectory_normalizer(Trajectories(train), residual=True)
    result: dict[str, Any] = {
        "problem": problem,
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()},
        "simulate_s": simulate_s,
        "persistence": persistence(problem, test, cfg),
        "platform": _platform(),
        "runs": [],
    }
    _append(log, {k: v for k, v in result.items() if k != "runs"})
    for seed in seeds:
        for setting in settings:
            model, seconds = train_one(problem, setting, seed, train, normalizer, cfg)
            scores = evaluate(problem, model, normalizer, test, cfg)
            run = {"problem": problem, "setting": setting, "seed": seed, "train_s": seconds}
            result["runs"].append({**run, **scores})
            _append(log, result["runs"][-1])
            print(json.dumps(result["runs"][-1]), flush=True)
    return result


def _platform() -> str:
    import jax

    return f"jax on {jax.devices()[0].platform}, {os.cpu_count()} CPU cores"


def _append(log: Path | None, record: dict) -> None:
    if log is not None:
        with open(log, "a") as f:
            f.write(json.dumps(record) + "\n")


def read_logs(paths: list[str]) -> list[dict]:
    """The results of one or more `--log` files, merged per problem."""
    results: dict[str, dict] = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            record = json.loads(line)
            if "setting" in record:
                results[record["problem"]]["runs"].append(record)
            else:
                results.setdefault(record["problem"], {**record, "runs": []})
    return list(results.values())


def _cell(values: list[float], percent: bool, digits: int = 1) -> str:
    mean = float(np.mean(values))
    half = 0.5 * (max(values) - min(values))
    if percent:
        return f"{100 * mean:.{digits}f} ± {100 * half:.{digits}f}%"
    return f"{mean:.{digits}f} ± {half:.{digits}f}"


def markdown(result: dict) -> str:
    """The table of one problem: mean ± spread over seeds per setting."""
    cfg, problem = result["config"], result["problem"]
    names = cfg["lead_names"]
    vpt_unit = "Lyapunov times" if problem == "lorenz96" else "steps"
    head = [
        "setting",
        *(f"nRMSE {n}" for n in names),
        f"VPT (nRMSE ≤ {cfg['vpt_threshold']}) [{vpt_unit}]",
        "training [s]",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" + "---:|" * (len(head) - 1)]
    seeds = sorted({r["seed"] for r in result["runs"]})
    for setting in dict.fromkeys(r["setting"] for r in result["runs"]):
        runs = [r for r in result["runs"] if r["setting"] == setting]
        cells = [_cell([r[n] for r in runs], True, cfg.get("digits", 1)) for n in names]
        cells.append(_cell([r["vpt"] for r in runs], False, 2))
        cells.append(_cell([r["train_s"] for r in runs], False, 0))
        lines.append(f"| {setting} | " + " | ".join(cells) + " |")
    p = result["persistence"]
    cells = [f"{100 * p[n]:.{cfg.get('digits', 1)}f}%" for n in names] + [f"{p['vpt']:.2f}", "—"]
    lines.append("| persistence | " + " | ".join(cells) + " |")
    note = (
        f"{problem}: {cfg['updates']} updates of batch {cfg['batch_size']} per run, "
        f"seeds {seeds} (mean ± half the range); {result.get('platform', '')}."
    )
    return note + "\n\n" + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", choices=[*PROBLEMS, "all"], default="all")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--log", help="append each finished run to this JSON-lines file")
    parser.add_argument("--table-from", nargs="+", help="only print the table of these logs")
    parser.add_argument("--markdown", help="write the tables here")
    args = parser.parse_args(argv)
    if args.table_from:
        results = read_logs(args.table_from)
    else:
        problems = list(PROBLEMS) if args.problem == "all" else [args.problem]
        log = Path(args.log) if args.log else None
        results = [run_problem(p, args.seeds, args.settings, args.quick, log) for p in problems]
    header = (
        "Measured with `python benchmarks/rollout_training_table.py "
        f"{' '.join(sys.argv[1:] if argv is None else argv)}` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n\n"
    )
    text = header + "\n".join(markdown(r) for r in results)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    return results


if __name__ == "__main__":
    main()
