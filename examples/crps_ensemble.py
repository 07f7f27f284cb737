"""Calibrated ensembles: a Lorenz-96 emulator trained by MSE, by a Gaussian likelihood and by the CRPS.

    uv run examples/crps_ensemble.py                                  # equinox, seeds 0 1 2
    uv run examples/crps_ensemble.py --backend lightning --seeds 0 --steps 2000
    uv run examples/crps_ensemble.py --problem ks      # a chaotic field, Equinox only

Lorenz-96 (`lorenz96.py`: 20 variables, F = 8, one emulator step = 0.05 time units,
one Lyapunov time about 13 steps) → trajectory windows of increments, split by
trajectory → three residual emulators, the same MLP body, the same updates, batch and
optimizer:

- **deterministic**: `loss="mse"`, one step; its "ensemble" is its one rollout.
- **Gaussian head**: `loss="gaussian_nll"`, one step; the ensemble samples every step
  from the predicted Gaussian (`rollout(..., stochastic=True)`).
- **CRPS ensemble**: a generative model of the state and `--noise-dim` channels of
  standard normal noise, `loss=losses.crps(members=M, noise_dim=w)` through
  `Rollout(steps=--crps-steps)`: every update rolls `M` members of every sample out
  from their own noise (drawn by core's feed) and scores them together with the fair
  CRPS. The ensemble draws fresh noise for every member at every step.

Every emulator is then rolled out from `--cases` held-out true states, `--members`
members each, on the model's device, and scored per lead time with core's ensemble
metrics (`pipekit_train.core.metrics`): the fair CRPS, the ensemble-mean RMSE and the
spread–skill ratio `sqrt((M + 1)/M) * spread / RMSE` (1 is calibrated, below 1 too
narrow). The table is the mean over `--seeds` (each seed: its own initial weights,
data order and noise). Writes `crps_ensemble.json` under `--out`.

`--problem ks` trains the same three on a chaotic field instead (`ks.py`: the
Kuramoto–Sivashinsky equation, 64 grid points, `L = 22`, one emulator step = 1 time
unit, one Lyapunov time about 23 steps): periodic 1-D conv nets
(`pipekit_train.equinox.testing:channels_first_conv`, channels-first, trained on the
channels-last fields through `layout="channels_last"`), the noise `--noise-dim` channels
at every grid point; Equinox only (the other backends' test factories are 2-D).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import ks
import lorenz96
import numpy as np
import toymodels

from pipekit_train.core import Rollout, TrainingLoop, losses
from pipekit_train.core.data import TrajectoryWindows, split_trajectories
from pipekit_train.core.metrics import crps_ensemble, spread_skill

LEADS = (1, 13, 26, 50)  # steps; 13 steps ≈ one Lyapunov time of Lorenz-96
KS_LEADS = (1, 12, 23, 46)  # steps; 23 steps ≈ one Lyapunov time of Kuramoto–Sivashinsky
METHODS = ("deterministic", "gaussian", "crps")


def optimizer(steps: int) -> dict[str, Any]:
    """The optimizer of every emulator: Adam, cosine decay from 2e-3, clipped."""
    return {
        "name": "adam",
        "lr": {"schedule": "cosine", "init_value": 2e-3, "decay_steps": steps, "alpha": 0.05},
        "clip_norm": 1.0,
    }


def train(method: str, args: argparse.Namespace, seed: int, trajectories: np.ndarray) -> Any:
    """Train one emulator; return `(artifact, forward)`."""
    from pipekit_train.core import NeuralForward

    field = args.problem == "ks"
    n = 1 if field else lorenz96.N  # the channels of a state
    k = args.crps_steps if method == "crps" else 1
    windows = TrajectoryWindows(trajectories, k=k, targets="increments")
    data, validation = split_trajectories(windows, (0.9, 0.1), seed=0)
    sizes = {
        "deterministic": (n, n),
        "gaussian": (n, 2 * n),
        "crps": (n + args.noise_dim, n),
    }[method]
    loss: Any = {
        "deterministic": "mse",
        "gaussian": "gaussian_nll",
        "crps": losses.crps(members=args.train_members, noise_dim=args.noise_dim),
    }[method]
    if field:
        from pipekit_train.equinox import EquinoxModelOp

        model = EquinoxModelOp(
            "pipekit_train.equinox.testing:channels_first_conv",
            num_spatial_dims=1,
            in_channels=sizes[0],
            out_channels=sizes[1],
            width=args.width,
            depth=3,
            kernel_size=5,
            layout="channels_last",
            seed=seed,
        )
    else:
        model = toymodels.model_op(
            args.backend, in_size=sizes[0], out_size=sizes[1], width=args.width, seed=seed
        )
    artifact = TrainingLoop(
        model=model,
        data=data,
        validation=validation,
        normalizer=data.normalizer(),
        loss=loss,
        rollout=Rollout(steps=k, residual=True) if method == "crps" else None,
        optimizer_config=optimizer(args.steps),
        batch_size=args.batch_size,
        max_steps=args.steps,
        validate_every_n_steps=args.steps,
        seed=seed,
        progress=False,
    ).run()
    head = {"deterministic": {}, "gaussian": {"head": "gaussian"}}.get(
        method, {"head": "generative", "noise_dim": args.noise_dim}
    )
    forward = NeuralForward(
        artifact.model,
        normalizer=artifact.normalizer,
        residual=True,
        state_ndim=2 if field else 1,
        **head,
    )
    return artifact, forward


def score(
    forward: Any, method: str, truth: np.ndarray, members: int, seed: int, leads: tuple
) -> dict:
    """Per lead: the ensemble's fair CRPS, ensemble-mean RMSE and spread–skill ratio.

    `truth` is `(cases, H + 1, d)`; the deterministic emulator's one rollout stands for
    an ensemble of one (its CRPS is its mean absolute error).
    """
    cases, horizon = truth.shape[0], truth.shape[1] - 1
    if method == "deterministic":
        run = np.asarray(forward.rollout(truth[:, 0], horizon), np.float64)  # (H+1, cases, d)
        ensemble = run[:, :, None]
    else:
        starts = np.repeat(truth[:, 0], members, axis=0)  # the members of a case adjacent
        run = np.asarray(forward.rollout(starts, horizon, stochastic=True, seed=seed), np.float64)
        ensemble = run.reshape(horizon + 1, cases, members, *truth.shape[2:])
    target = np.moveaxis(truth, 0, 1).astype(np.float64)  # (H + 1, cases, d)
    out: dict[str, list[float]] = {"crps": [], "rmse": [], "spread_skill": []}
    for lead in leads:
        e, t = ensemble[lead], target[lead]  # (cases, M, d), (cases, d)
        if method == "deterministic":
            out["crps"].append(float(np.abs(e[:, 0] - t).mean()))
            out["rmse"].append(float(np.sqrt(((e[:, 0] - t) ** 2).mean())))
            out["spread_skill"].append(0.0)
            continue
        out["crps"].append(float(crps_ensemble(e, t, member_axis=1).mean()))
        stats = spread_skill(e, t, member_axis=1)
        out["rmse"].append(float(stats["rmse"]))
        out["spread_skill"].append(float(stats["ratio"]))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="equinox", choices=["equinox", "lightning", "keras"])
    parser.add_argument("--problem", default="lorenz96", choices=["lorenz96", "ks"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--steps", type=int, default=4000, help="training updates")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--trajectories", type=int, default=256, help="simulated for training")
    parser.add_argument("--length", type=int, default=200, help="steps per trajectory")
    parser.add_argument("--noise-dim", type=int, default=20, help="the CRPS model's noise channels")
    parser.add_argument("--train-members", type=int, default=4, help="CRPS members per sample")
    parser.add_argument("--crps-steps", type=int, default=1, help="the CRPS rollout's length")
    parser.add_argument("--cases", type=int, default=64, help="held-out start states")
    parser.add_argument("--members", type=int, default=32, help="ensemble members scored")
    parser.add_argument("--horizon", type=int, default=50)
    parser.add_argument("--out", default=str(Path(__file__).parent / "out" / "crps_ensemble"))
    args = parser.parse_args(argv)
    if args.problem == "ks" and args.backend != "equinox":
        parser.error(f"--problem ks runs on equinox only. Received: --backend {args.backend}.")
    out = Path(args.out) / (args.backend if args.problem == "lorenz96" else f"ks-{args.backend}")
    out.mkdir(parents=True, exist_ok=True)

    simulator = ks if args.problem == "ks" else lorenz96
    leads = tuple(lead for lead in (KS_LEADS if args.problem == "ks" else LEADS))
    leads = tuple(lead for lead in leads if lead <= args.horizon)
    trajectories = simulator.trajectories(args.trajectories, args.length, seed=0)
    truth = simulator.trajectories(args.cases, args.horizon, seed=1)  # (cases, H + 1, *state)
    results: dict[str, Any] = {m: [] for m in args.methods}
    for seed in args.seeds:
        for method in args.methods:
            start = time.perf_counter()
            artifact, forward = train(method, args, seed, trajectories)
            seconds = time.perf_counter() - start
            scores = score(forward, method, truth, args.members, seed, leads)
            scores["train_s"] = seconds
            results[method].append(scores)
            ss = " ".join(f"{v:.2f}" for v in scores["spread_skill"])
            print(
                f"seed {seed} {method:13s} {seconds:6.1f} s  crps "
                + " ".join(f"{v:.3f}" for v in scores["crps"])
                + "  rmse "
                + " ".join(f"{v:.3f}" for v in scores["rmse"])
                + f"  spread/rmse {ss}",
                flush=True,
            )

    print(
        f"\n{args.problem}, {args.backend}, mean over seeds {args.seeds}, {args.steps} updates of batch "
        f"{args.batch_size}, {args.cases} held-out starts x {args.members} members:"
    )
    print("| method | lead | CRPS | ensemble-mean RMSE | spread / RMSE | training s |")
    print("|---|---:|---:|---:|---:|---:|")
    table: dict[str, Any] = {}
    for method, runs in results.items():
        mean = {key: np.mean([r[key] for r in runs], axis=0) for key in runs[0]}
        table[method] = {key: np.asarray(v).tolist() for key, v in mean.items()}
        for i, lead in enumerate(leads):
            ratio = "–" if method == "deterministic" else f"{mean['spread_skill'][i]:.2f}"
            print(
                f"| {method} | {lead} | {mean['crps'][i]:.4f} | {mean['rmse'][i]:.4f} | "
                f"{ratio} | {float(mean['train_s']):.0f} |"
            )
    summary = {"args": vars(args), "leads": leads, "runs": results, "mean": table}
    (out / "crps_ensemble.json").write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    os.environ.setdefault("KERAS_BACKEND", "jax")
    main()
