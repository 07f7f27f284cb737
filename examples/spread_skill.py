"""Spread–skill: a Gaussian-head Lorenz-96 emulator, its stochastic ensemble, and an EnKF.

    uv run examples/spread_skill.py                        # equinox, default settings
    uv run examples/spread_skill.py --backend lightning --steps 4000

Lorenz-96 (`lorenz96.py`: 20 variables, chaotic, one emulator step = 0.05 time units,
one Lyapunov time about 13 steps) → trajectory windows of one step, split by trajectory
→ a residual emulator with a **Gaussian head** (a mean and a log-variance of the
increment per variable, trained with `gaussian_nll`) → register → load →
`NeuralForward.from_record(..., residual=True)` (the head and the normalizer come back
from the registry record). Then:

1. **Spread–skill.** From each of `--cases` held-out true states an ensemble of
   `--members` members, all started at that state, is rolled out `--horizon` steps
   with `rollout(..., stochastic=True, seed=...)`: every member draws its next state from
   the predicted Gaussian at every step, on the model's device, so the ensemble's
   spread is the model's own uncertainty. Per lead time the example prints the RMSE of
   the ensemble mean against the truth (the skill), the ensemble spread (the square
   root of the mean ensemble variance), their ratio, and the RMSE of the deterministic
   (mean) rollout. A calibrated ensemble has spread ≈ error (×`sqrt(1 + 1/members)`).
2. **Data assimilation.** An ensemble Kalman filter (the stochastic EnKF with perturbed
   observations and multiplicative inflation, in numpy) observes every second variable
   every `--obs-every` steps with noise of `--obs-std`; the emulator forecasts between
   the observations on its device through `Cycle(..., hook=analysis,
   hook_steps=obs_every)`, and the hook runs the analysis on the host at the observation
   times. Printed: the RMSE of the analysis mean over the second half of the window,
   against the same filter forecasting with the simulator itself (a perfect model) and a
   free ensemble run (no observations).

Writes `spread_skill.png` (the `plot` extra) and `loss.png` under `--out`.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from typing import Any

import lorenz96
import numpy as np
import toymodels

from pipekit_train.core import Cycle, LocalModelRegistry, NeuralForward, TrainingLoop
from pipekit_train.core.data import TrajectoryWindows, split_trajectories

LEADS = (1, 2, 4, 8, 13, 20, 26, 39, 50)  # steps; 13 steps ≈ one Lyapunov time


def spread_skill(
    ensemble: np.ndarray, truth: np.ndarray, members: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per lead: the RMSE of the ensemble mean against the truth, and the ensemble spread.

    Args:
        ensemble: states `(H + 1, cases * members, d)`, the members of a case adjacent.
        truth: the true states `(H + 1, cases, d)`.
        members: ensemble members per case.

    Returns:
        `(error, spread)`, each `(H + 1,)`: `sqrt(mean((mean_m - truth)²))` and
        `sqrt(mean(var_m))` (the unbiased variance over members), both averaged over cases
        and variables before the square root.
    """
    steps, _, d = ensemble.shape
    grouped = ensemble.reshape(steps, -1, members, d)
    error = np.sqrt(((grouped.mean(axis=2) - truth) ** 2).mean(axis=(1, 2)))
    spread = np.sqrt(grouped.var(axis=2, ddof=1).mean(axis=(1, 2)))
    return error, spread


def enkf_analysis(
    ensemble: np.ndarray,
    observation: np.ndarray,
    observed: np.ndarray,
    obs_std: float,
    inflation: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """The stochastic ensemble Kalman filter update of an ensemble `(m, d)`, in numpy.

    The anomalies are first inflated by `inflation` about the ensemble mean; each member
    then assimilates the observation of the variables `observed` perturbed with its own
    draw of the observation noise (`N(0, obs_std²)`), with the gain of the ensemble
    covariance: `K = P Hᵀ (H P Hᵀ + R)⁻¹`.
    """
    mean = ensemble.mean(axis=0)
    ensemble = mean + inflation * (ensemble - mean)
    anomalies = ensemble - ensemble.mean(axis=0)
    m = len(ensemble)
    hx = ensemble[:, observed]  # H x per member, (m, p)
    h_anomalies = anomalies[:, observed]
    p_ht = anomalies.T @ h_anomalies / (m - 1)  # (d, p)
    hp_ht = h_anomalies.T @ h_anomalies / (m - 1)  # (p, p)
    gain = np.linalg.solve(hp_ht + obs_std**2 * np.eye(len(observed)), p_ht.T).T  # (d, p)
    perturbed = observation + obs_std * rng.standard_normal(hx.shape)
    return ensemble + (perturbed - hx) @ gain.T


def figure(result: dict[str, Any], backend: str) -> Any:
    """Spread and error per lead time; the filter's error over the assimilation window.

    Returns:
        A matplotlib `Figure` (Agg canvas; no pyplot state).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 4.6), dpi=100)
    FigureCanvasAgg(fig)
    skill, da = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    lead = np.arange(len(result["error"])) * lorenz96.EMULATOR_DT / lorenz96.LYAPUNOV_TIME
    skill.plot(lead[1:], result["error"][1:], "C0", lw=2, label="error of the ensemble mean")
    skill.plot(lead[1:], result["spread"][1:], "C1", lw=2, label="ensemble spread")
    skill.plot(lead[1:], result["deterministic"][1:], "C0--", label="error of the mean rollout")
    skill.axhline(result["climate_std"], color="0.5", ls=":", label="climatological std")
    skill.set(
        xlabel="lead time [Lyapunov times]",
        ylabel="RMSE / spread",
        title=f"spread–skill: {result['cases']} cases × {result['members']} members",
    )
    skill.legend(fontsize=8)
    t = np.arange(len(result["analysis_rmse"])) * lorenz96.EMULATOR_DT
    da.plot(t, result["free_rmse"], "0.5", label="free ensemble (no observations)")
    da.plot(t, result["analysis_rmse"], "C2", label="EnKF, the emulator forecasting")
    da.plot(t, result["perfect_rmse"], "C4", alpha=0.7, label="EnKF, the simulator forecasting")
    da.axhline(result["obs_std"], color="C3", ls=":", label="observation noise std")
    da.set(
        xlabel="time [time units]",
        ylabel="RMSE of the ensemble mean (all 20 variables)",
        yscale="log",
        title=f"EnKF: every 2nd variable observed every {result['obs_every']} steps",
    )
    da.legend(fontsize=8)
    for ax in (skill, da):
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"Lorenz-96, Gaussian-head emulator ({backend})", fontsize=10)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="equinox", choices=["equinox", "lightning", "keras"])
    parser.add_argument("--steps", type=int, default=4000, help="training updates")
    parser.add_argument("--trajectories", type=int, default=256, help="simulated for training")
    parser.add_argument("--length", type=int, default=200, help="steps per trajectory")
    parser.add_argument("--cases", type=int, default=32, help="spread-skill start states")
    parser.add_argument("--members", type=int, default=32, help="ensemble members")
    parser.add_argument("--horizon", type=int, default=50, help="steps of the ensemble rollout")
    parser.add_argument("--obs-every", type=int, default=4, help="steps between observations")
    parser.add_argument("--obs-std", type=float, default=1.0, help="observation noise std")
    parser.add_argument("--cycles", type=int, default=50, help="assimilation cycles")
    parser.add_argument(
        "--inflation", type=float, default=1.3, help="multiplicative, of the anomalies"
    )
    parser.add_argument("--out", default=str(Path(__file__).parent / "out" / "spread_skill"))
    args = parser.parse_args(argv)
    out = Path(args.out) / args.backend
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)

    # 1. simulate, make one-step windows (increments), split by trajectory, train
    trajectories = lorenz96.trajectories(args.trajectories, args.length, seed=0)
    windows = TrajectoryWindows(trajectories, k=1, targets="increments")
    train, val = split_trajectories(windows, (0.9, 0.1), seed=0)
    normalizer = train.normalizer()
    artifact = TrainingLoop(
        model=toymodels.model_op(
            args.backend, in_size=lorenz96.N, out_size=2 * lorenz96.N, width=128, seed=0
        ),
        data=train,
        validation=val,
        normalizer=normalizer,
        loss="gaussian_nll",  # a mean and a log-variance per variable: the Gaussian head
        optimizer_config={
            "name": "adam",
            "lr": {
                "schedule": "cosine",
                "init_value": 2e-3,
                "decay_steps": args.steps,
                "alpha": 0.05,
            },
            "clip_norm": 1.0,
        },
        batch_size=256,
        max_steps=args.steps,
        validate_every_n_steps=max(1, args.steps // 5),
        seed=0,
        progress=False,
    ).run()
    print(artifact.summary())

    # 2. register, load back: the head ("gaussian") and the normalizer travel with it
    registry = LocalModelRegistry(out / "registry")
    artifact.register(registry, "lorenz96-gaussian")
    record, model = registry.load_record_and_model("lorenz96-gaussian")
    emulator = NeuralForward.from_record(record, model, residual=True)
    assert emulator.head == "gaussian"

    # 3. spread–skill: ensembles started at held-out true states, sampled every step
    truth = lorenz96.trajectories(args.cases, args.horizon, seed=1)  # (cases, H + 1, d)
    starts = np.repeat(truth[:, 0], args.members, axis=0)  # members of a case adjacent
    ensemble = emulator.rollout(starts, args.horizon, stochastic=True, seed=0)
    truth_t = np.moveaxis(truth, 0, 1).astype(np.float64)  # (H + 1, cases, d)
    error, spread = spread_skill(np.asarray(ensemble, np.float64), truth_t, args.members)
    mean_rollout = np.asarray(emulator.rollout(truth[:, 0], args.horizon), np.float64)
    deterministic = np.sqrt(((mean_rollout - truth_t) ** 2).mean(axis=(1, 2)))
    climate_std = float(trajectories.std())
    print(
        f"\nspread-skill, {args.cases} held-out start states x {args.members} members "
        f"(one Lyapunov time = {lorenz96.LYAPUNOV_TIME / lorenz96.EMULATOR_DT:.0f} steps; "
        f"climatological std {climate_std:.2f}):"
    )
    print(
        "| lead | Lyapunov times | ensemble-mean RMSE | spread | spread / RMSE | mean-rollout RMSE |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    table = []
    for lead in (lead for lead in LEADS if lead <= args.horizon):
        line = (lead, error[lead], spread[lead], spread[lead] / error[lead], deterministic[lead])
        table.append(line)
        lyap = lead * lorenz96.EMULATOR_DT / lorenz96.LYAPUNOV_TIME
        print(
            f"| {lead} | {lyap:.2f} | {line[1]:.4f} | {line[2]:.4f} | {line[3]:.2f} "
            f"| {line[4]:.4f} |"
        )

    # 4. an EnKF: forecasts on the device between observations, analyses on the host
    n_steps = args.cycles * args.obs_every
    true_run = lorenz96.trajectories(1, n_steps, seed=2)[0].astype(np.float64)  # (T + 1, d)
    observed = np.arange(0, lorenz96.N, 2)
    rng = np.random.default_rng(3)
    observations = true_run[:, observed] + args.obs_std * rng.standard_normal(
        (n_steps + 1, len(observed))
    )
    # the first guess: members drawn from the climate (states of the training trajectories)
    pool = trajectories.reshape(-1, lorenz96.N)
    first_guess = pool[rng.choice(len(pool), args.members, replace=False)].astype(np.float64)

    def analysis(step: int, members: np.ndarray) -> np.ndarray:
        return enkf_analysis(
            members, observations[step], observed, args.obs_std, args.inflation, rng
        )

    cycle = Cycle(emulator, n_steps, hook=analysis, hook_steps=args.obs_every)
    assert cycle.on_device  # the segments between observations run on the device
    analysed = cycle.run(first_guess)  # (T + 1, members, d)
    free = emulator.rollout(first_guess, n_steps)
    # the same filter with the simulator itself forecasting (a perfect model), for scale
    perfect = Cycle(lorenz96.advance, n_steps, hook=analysis, hook_steps=args.obs_every)
    perfect_run = perfect.run(first_guess)
    analysis_rmse = np.sqrt(((analysed.mean(axis=1) - true_run) ** 2).mean(axis=1))
    free_rmse = np.sqrt(((np.asarray(free).mean(axis=1) - true_run) ** 2).mean(axis=1))
    perfect_rmse = np.sqrt(((perfect_run.mean(axis=1) - true_run) ** 2).mean(axis=1))
    at_obs = np.arange(args.obs_every, n_steps + 1, args.obs_every)
    second_half = at_obs[len(at_obs) // 2 :]
    da_rmse = float(np.sqrt((analysis_rmse[second_half] ** 2).mean()))
    free_da_rmse = float(np.sqrt((free_rmse[second_half] ** 2).mean()))
    perfect_da_rmse = float(np.sqrt((perfect_rmse[second_half] ** 2).mean()))
    print(
        f"\nEnKF, {args.members} members, every 2nd variable observed every {args.obs_every} "
        f"steps (noise std {args.obs_std}), {args.cycles} cycles: analysis RMSE over the "
        f"second half {da_rmse:.3f} (all 20 variables; the same filter forecasting with the "
        f"simulator {perfect_da_rmse:.3f}; free ensemble {free_da_rmse:.3f})"
    )

    result: dict[str, Any] = {
        "error": error,
        "spread": spread,
        "deterministic": deterministic,
        "table": table,
        "climate_std": climate_std,
        "cases": args.cases,
        "members": args.members,
        "analysis_rmse": analysis_rmse,
        "free_rmse": free_rmse,
        "da_rmse": da_rmse,
        "free_da_rmse": free_da_rmse,
        "perfect_rmse": perfect_rmse,
        "perfect_da_rmse": perfect_da_rmse,
        "obs_std": args.obs_std,
        "obs_every": args.obs_every,
        "head": record.head,
        **artifact.final_metrics,
    }
    figure(result, args.backend).savefig(out / "spread_skill.png")
    artifact.history.plot(out / "loss.png")
    print(f"figures: {out / 'spread_skill.png'}, {out / 'loss.png'}")
    return result


if __name__ == "__main__":
    os.environ.setdefault("KERAS_BACKEND", "jax")
    main()
