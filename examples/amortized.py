"""Amortized inference: oscillator trajectories → (frequency, damping), with calibrated uncertainty.

    uv run examples/amortized.py --backend equinox

A network maps a noisy 40-step trajectory to a Gaussian over the parameters (a mean and
a log-variance per parameter, trained with `gaussian_nll`). The trained model goes
through the registry, which records its Gaussian head, and comes back as
`NeuralForward.from_record(...)`, whose `distribution(x)` gives means and standard
deviations in the parameters' own units. On held-out simulations the script prints
the RMSE of the means and the coverage of the 68% / 95% intervals (how often the true
parameter lies inside; 0.68 / 0.95 when the uncertainty is calibrated) and draws a
calibration curve next to predicted-vs-true panels.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
import toymodels

from pipekit_train.core import Gaussian, LocalModelRegistry, NeuralForward, TrainingLoop
from pipekit_train.core.data import (
    CachedDataset,
    Normalizer,
    SimulationDataset,
    as_supervised,
    split,
)

N_OBS = 40
NOISE = 0.05
NAMES = ("ω (frequency)", "ζ (damping)")
LEVELS = np.linspace(0.02, 0.98, 49)


def sample_parameters(rng: np.random.Generator) -> np.ndarray:
    """Prior: ω ~ U(1, 3), ζ ~ U(0.05, 0.5)."""
    return np.array([rng.uniform(1.0, 3.0), rng.uniform(0.05, 0.5)], dtype=np.float32)


def observe(theta: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Stochastic simulator: the trajectory for `theta` plus observation noise.

    `SimulationDataset` hands a simulator with an `rng` parameter its own generator for
    the item, derived from `(seed, i)`, so item `i` is the same in every process.
    """
    omega, zeta = (float(v) for v in theta)
    clean = toymodels.trajectory(omega, zeta, n_steps=N_OBS)
    return (clean + NOISE * rng.standard_normal(N_OBS)).astype(np.float32)


def coverage(dist: Gaussian, truth: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Fraction of true values inside the central `level` interval, per level and parameter."""
    z = np.abs(dist.z_score(truth))
    half_width = np.array([NormalDist().inv_cdf(0.5 + level / 2) for level in levels])
    return (z[None, :, :] <= half_width[:, None, None]).mean(axis=1)


def plot(path: Path, truth: np.ndarray, dist: Gaussian, backend: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(truth)
    fig, axes = plt.subplots(2, 2, figsize=(12, 10.5), dpi=100)
    curves = coverage(dist, truth, LEVELS)
    pooled = coverage(dist, truth, np.array([0.68, 0.95])).mean(axis=1)
    band = 2 * np.sqrt(LEVELS * (1 - LEVELS) / n)  # ±2 standard errors of one coverage
    fig.suptitle(
        f"{backend}: amortized posterior of the damped oscillator, {n} test simulations",
        fontsize=13,
    )

    ax = axes[0, 0]
    ax.fill_between(LEVELS, LEVELS - band, LEVELS + band, color="0.8", label="±2 s.e.")
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="calibrated (diagonal)")
    for i, name in enumerate(NAMES):
        ax.plot(LEVELS, curves[:, i], lw=1.8, label=name)
    ax.plot([0.68, 0.95], pooled, "ko", ms=4, label="both parameters, 68% and 95%")
    for level, cover in zip((0.68, 0.95), pooled, strict=True):
        ax.annotate(f"{cover:.3f}", (level, cover), xytext=(6, -14), textcoords="offset points")
    ax.set(
        xlim=(0, 1),
        ylim=(0, 1),
        xlabel="nominal coverage of the central interval",
        ylabel="empirical coverage (fraction of true values inside)",
        title="calibration curve",
    )
    ax.set_aspect("equal")
    ax.legend(loc="upper left", fontsize=8)

    ax = axes[0, 1]
    limit = max(0.06, 1.15 * float(np.abs(curves - LEVELS[:, None]).max()))
    ax.fill_between(LEVELS, -band, band, color="0.8", label="±2 s.e.")
    ax.axhline(0, color="k", ls="--", lw=1)
    for bound in (-0.02, 0.02):
        ax.axhline(bound, color="0.4", ls=":", lw=1, label="±0.02" if bound > 0 else None)
    for i, name in enumerate(NAMES):
        ax.plot(LEVELS, curves[:, i] - LEVELS, lw=1.8, label=name)
    ax.plot([0.68, 0.95], pooled - [0.68, 0.95], "ko", ms=4, label="both, 68% and 95%")
    ax.set(
        xlim=(0, 1),
        ylim=(-limit, limit),
        xlabel="nominal coverage of the central interval",
        ylabel="empirical − nominal coverage (< 0: overconfident)",
        title="coverage error",
    )
    ax.legend(loc="lower left", fontsize=8)

    shown = np.random.default_rng(0).choice(n, size=min(n, 60), replace=False)
    low, high = dist.interval(0.95)
    for i, ax in enumerate(axes[1]):
        t, m = truth[shown, i], dist.mean[shown, i]
        inside = (t >= low[shown, i]) & (t <= high[shown, i])
        err = np.stack([m - low[shown, i], high[shown, i] - m])
        for mask, colour, label in ((inside, "C0", "inside"), (~inside, "C3", "outside")):
            ax.errorbar(
                t[mask], m[mask], yerr=err[:, mask], fmt="o", ms=3.5, color=colour,
                elinewidth=1, capsize=2, label=f"true value {label} the interval ({mask.sum()})",
            )  # fmt: skip
        lo, hi = truth[:, i].min(), truth[:, i].max()
        ax.plot([lo, hi], [lo, hi], "k--", lw=1)
        ax.set(
            xlabel=f"true {NAMES[i]}",
            ylabel=f"predicted {NAMES[i]}: mean ± 95% interval",
            title=f"{NAMES[i]}: {len(shown)} random test simulations",
        )
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="equinox", choices=["equinox", "lightning", "keras"])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--samples", type=int, default=131072)
    parser.add_argument(
        "--workers", type=int, default=0, help="processes simulating in parallel (0: this one)"
    )
    parser.add_argument("--out", default=str(Path(__file__).parent / "out" / "amortized"))
    args = parser.parse_args(argv)
    out = Path(args.out) / args.backend
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)

    # Simulations with the default keys {"theta": parameters, "x": trajectory}, cached;
    # inference reads the trajectory and predicts the parameters.
    sims = SimulationDataset(observe, sample_parameters, n=args.samples, seed=1)
    cache = CachedDataset.build(
        sims, out / "simulations.zarr", chunk_size=4096, workers=args.workers
    )
    data = as_supervised(cache, input="x", target="theta")
    train, val, test = split(data, (0.8, 0.1, 0.1), seed=0)
    norm = Normalizer.fit(train, keys=("x", "y"))
    loop = TrainingLoop(
        model=toymodels.model_op(args.backend, in_size=N_OBS, out_size=4, width=128, seed=0),
        data=train,
        validation=val,
        normalizer=norm,
        loss="gaussian_nll",
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
        validate_every_n_steps=max(1, args.steps // 8),
        seed=0,
    )
    artifact = loop.run()
    print(artifact.summary())

    # The registry records the Gaussian head (inferred from the `gaussian_nll` loss), so
    # the loader gets means and standard deviations in the parameters' units.
    registry = LocalModelRegistry(out / "registry")
    artifact.register(registry, "oscillator-posterior")
    record, model = registry.load_record_and_model("oscillator-posterior")
    posterior = NeuralForward.from_record(record, model)

    batch = test.get_batch(np.arange(len(test)))
    truth = np.asarray(batch["y"], dtype=np.float64)
    dist = posterior.distribution(batch["x"])
    assert isinstance(dist, Gaussian)  # the head this example trains
    rmse = np.sqrt(np.mean((dist.mean - truth) ** 2, axis=0))
    per_parameter = coverage(dist, truth, np.array([0.68, 0.95]))
    cover68, cover95 = (float(c) for c in per_parameter.mean(axis=1))
    plot(out / "posterior.png", truth, dist, args.backend)
    print(
        f"head {record.head!r}; held-out RMSE: omega={rmse[0]:.4f}, zeta={rmse[1]:.4f} "
        f"(prior std {truth.std(axis=0).round(3).tolist()})"
    )
    print(
        f"coverage on {len(test)} test simulations: 68% interval {cover68:.3f}, "
        f"95% interval {cover95:.3f} (omega {per_parameter[:, 0].round(3).tolist()}, "
        f"zeta {per_parameter[:, 1].round(3).tolist()})"
    )
    print(f"figure: {out / 'posterior.png'}")
    return {
        "rmse_omega": float(rmse[0]),
        "rmse_zeta": float(rmse[1]),
        "coverage68": cover68,
        "coverage95": cover95,
        "n_test": len(test),
        "head": record.head,
    }


if __name__ == "__main__":
    os.environ.setdefault("KERAS_BACKEND", "jax")
    main()
