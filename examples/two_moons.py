"""Two moons: a bimodal posterior learned by a mixture density network, judged by C2ST.

    uv run examples/two_moons.py --backend equinox            # mixture head (default)
    uv run examples/two_moons.py --backend keras --head gaussian
    uv run examples/two_moons.py --backend lightning --head flow   # normalizing-flow head

sbibm's `two_moons` task (Lueckmann et al. 2021, task T.8): parameters θ ~ U(-1, 1)²,
and the simulator

    a ~ U(-π/2, π/2),  r ~ N(0.1, 0.01²),  p = (r cos a + 0.25, r sin a)
    x = p + (-|θ1 + θ2| / √2, (θ2 - θ1) / √2)

The fold |θ1 + θ2| makes the posterior p(θ | x) two crescents, mirror images across
θ1 + θ2 = 0. A network maps x to a mixture of `--components` full-covariance Gaussians
over θ (`losses.mixture_nll`); the MLP scales the weight logits by `--logit-scale`
(0.03: they move about thirty times slower under Adam, so components do not die before
they find their part of a crescent); the registry records the mixture head, and
`NeuralForward.from_record(...).distribution(x)` returns a `Mixture` in θ's units.

Evaluation: at a few fixed observations the script draws posterior samples from the
network (samples outside the prior box are rejected, as sbi does for a bounded prior)
and from the exact reference sampler `reference_posterior`, and reports the classifier
two-sample test (`c2st`: the 5-fold cross-validated accuracy of an MLP telling the two
sample sets apart; 0.5 means indistinguishable, 1.0 means disjoint). `--head gaussian`
trains the Gaussian head (`gaussian_nll`) instead, for comparison: one ellipse cannot
cover two crescents. `--head flow` trains the normalizing-flow head
(`losses.flow_nll(flow_layers=--flow-layers, flow_bins=--flow-bins)`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import toymodels

from pipekit_train.core import LocalModelRegistry, NeuralForward, TrainingLoop, diagnostics, losses
from pipekit_train.core.data import (
    CachedDataset,
    Normalizer,
    SimulationDataset,
    as_supervised,
    split,
)

#: Parameters of the observations the posterior is checked at (fixed, inside the prior).
THETA_OBS = np.array([[0.3, 0.4], [-0.6, 0.1], [0.1, -0.7], [0.8, 0.5]])
R_MEAN, R_STD = 0.1, 0.01


def sample_parameters(rng: np.random.Generator) -> np.ndarray:
    """The prior: θ ~ U(-1, 1)²."""
    return rng.uniform(-1.0, 1.0, size=2).astype(np.float32)


def simulate(theta: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """sbibm's two_moons simulator for one θ (see the module docstring)."""
    a = rng.uniform(-np.pi / 2, np.pi / 2)
    r = rng.normal(R_MEAN, R_STD)
    t1, t2 = float(theta[0]), float(theta[1])
    x = (r * np.cos(a) + 0.25 - abs(t1 + t2) / np.sqrt(2), r * np.sin(a) + (t2 - t1) / np.sqrt(2))
    return np.array(x, dtype=np.float32)


def reference_posterior(x: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` exact draws from p(θ | x) for one observation `x` (shape `(2,)`).

    The simulator is x = p + g(θ) with p = (r cos a + 0.25, r sin a) independent of θ and
    g(θ) = (-|θ1 + θ2| / √2, (θ2 - θ1) / √2) piecewise linear with |det g'| = 1, so the
    likelihood is p(x | θ) = density_p(x - g(θ)). Draw p from its own distribution (a, r
    as in the simulator), solve x - p = g(θ) for θ: |θ1 + θ2| = -√2 (x1 - p1) (no
    solution when that is negative), θ2 - θ1 = √2 (x2 - p2), and the sign of θ1 + θ2
    is + or - with probability 1/2 each (both preimages have the same likelihood). This
    gives θ with density ∝ p(x | θ); keeping the draws inside the prior box (a uniform
    prior) makes it exactly p(θ | x). Rejection repeats until `n` draws are kept.
    """
    x = np.asarray(x, dtype=np.float64)
    kept: list[np.ndarray] = []
    total = 0
    while total < n:
        m = 4 * (n - total) + 64
        a = rng.uniform(-np.pi / 2, np.pi / 2, m)
        r = rng.normal(R_MEAN, R_STD, m)
        p1, p2 = r * np.cos(a) + 0.25, r * np.sin(a)
        s_abs = -np.sqrt(2) * (x[0] - p1)
        diff = np.sqrt(2) * (x[1] - p2)
        s = np.where(rng.random(m) < 0.5, 1.0, -1.0) * s_abs
        theta = np.stack([(s - diff) / 2, (s + diff) / 2], axis=1)
        ok = (s_abs >= 0) & np.all(np.abs(theta) <= 1.0, axis=1)
        kept.append(theta[ok])
        total += int(ok.sum())
    return np.concatenate(kept)[:n]


def observation(theta: np.ndarray, seed: int) -> np.ndarray:
    """One simulated observation at `theta`, reproducible from `seed`."""
    return simulate(theta, np.random.default_rng(seed))


def c2st(a: np.ndarray, b: np.ndarray, *, seed: int = 0, folds: int = 5) -> float:
    """Classifier two-sample test: the mean k-fold accuracy telling `a` from `b`.

    `pipekit_train.core.diagnostics.c2st` with sbibm's classifier (both sets z-scored
    with `a`'s mean and standard deviation, an MLP with two hidden layers of 10·dim ReLU
    units, 5-fold stratified cross-validation), capped at 1000 iterations here (sbibm:
    10000) to keep the example quick. 0.5: the classifier cannot tell them apart.
    """
    return diagnostics.c2st(a, b, seed=seed, folds=folds, max_iter=1000)


def posterior_samples(
    posterior: NeuralForward, x: np.ndarray, n: int, rng
) -> tuple[np.ndarray, float]:
    """`n` network posterior draws at `x` inside the prior box, and the share rejected."""
    dist = posterior.distribution(x)
    kept: list[np.ndarray] = []
    drawn = total = 0
    while total < n:
        draws = np.asarray(dist.sample(rng, 2 * (n - total) + 64), dtype=np.float64)
        inside = draws[np.all(np.abs(draws) <= 1.0, axis=1)]
        drawn += len(draws)
        total += len(inside)
        kept.append(inside)
    return np.concatenate(kept)[:n], 1.0 - total / drawn


def plot(path: Path, observations, references, samples, scores, backend: str, head: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(observations)
    fig, axes = plt.subplots(2, n, figsize=(4.2 * n, 8.8), dpi=100, squeeze=False)
    fig.suptitle(
        f"two moons, {backend}, {head} head: posterior samples (blue) vs exact reference "
        "(grey); bottom row: zoom on the mode holding the true θ", fontsize=12,
    )  # fmt: skip
    for i in range(n):
        ref, got = references[i][:1500], samples[i][:1500]
        truth = THETA_OBS[i]
        side = np.sign(truth.sum())
        mode = ref[np.sign(ref.sum(axis=1)) == side]
        centre = mode.mean(axis=0)
        half = max(0.12, 1.3 * float(np.abs(mode - centre).max()))
        for row, ax in enumerate(axes[:, i]):
            ax.scatter(ref[:, 0], ref[:, 1], s=2 + 3 * row, c="0.5", alpha=0.5, lw=0,
                       label="reference")  # fmt: skip
            ax.scatter(got[:, 0], got[:, 1], s=2 + 3 * row, c="C0", alpha=0.4, lw=0, label=head)
            ax.plot(*truth, "r+", ms=12, mew=2, label="true θ")
            if row == 0:
                ax.plot([-1, 1], [1, -1], color="0.8", lw=0.8, ls="--")
                ax.set(xlim=(-1, 1), ylim=(-1, 1), title=(
                    f"x = ({observations[i][0]:.3f}, {observations[i][1]:.3f})\n"
                    f"C2ST {scores[i]:.3f}"))  # fmt: skip
            else:
                ax.set(xlim=(centre[0] - half, centre[0] + half),
                       ylim=(centre[1] - half, centre[1] + half), title="zoom")  # fmt: skip
            ax.set(xlabel="θ1", ylabel="θ2")
            ax.set_aspect("equal")
        if i == 0:
            axes[0, 0].legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="equinox", choices=["equinox", "lightning", "keras"])
    parser.add_argument("--head", default="mixture", choices=["mixture", "gaussian", "flow"])
    parser.add_argument("--flow-layers", type=int, default=4, help="flow head: layers")
    parser.add_argument("--flow-bins", type=int, default=8, help="flow head: spline bins")
    parser.add_argument("--components", type=int, default=8, help="mixture components K")
    parser.add_argument(
        "--logit-scale",
        type=float,
        default=0.03,
        help="factor on the mixture-weight logits (1: the plain MLP)",
    )
    parser.add_argument("--steps", type=int, default=10000)
    parser.add_argument("--samples", type=int, default=65536, help="simulation budget")
    parser.add_argument("--posterior-samples", type=int, default=2000, help="per side, for C2ST")
    parser.add_argument("--seed", type=int, default=0, help="network initialisation seed")
    parser.add_argument("--out", default=str(Path(__file__).parent / "out" / "two_moons"))
    args = parser.parse_args(argv)
    out = Path(args.out) / args.backend / args.head
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    sims = SimulationDataset(simulate, sample_parameters, n=args.samples, seed=1)
    cache = CachedDataset.build(sims, out / "simulations.zarr", chunk_size=4096)
    data = as_supervised(cache, input="x", target="theta")
    train, val = split(data, (0.9, 0.1), seed=0)
    norm = Normalizer.fit(train, keys=("x", "y"))
    options: dict[str, Any] = {}
    if args.head == "mixture":
        loss = losses.mixture_nll(n_components=args.components, covariance="full")
        width = losses.mixture_width(args.components, 2, "full")
        # the weight logits move `logit_scale` times slower (toymodels: no dead components)
        options = {"n_logits": args.components, "logit_scale": args.logit_scale}
    elif args.head == "flow":
        loss = losses.flow_nll(flow_layers=args.flow_layers, flow_bins=args.flow_bins)
        width = losses.flow_width(2, args.flow_layers, args.flow_bins)
    else:
        loss, width = losses.gaussian_nll, 4
    loop = TrainingLoop(
        model=toymodels.model_op(
            args.backend, in_size=2, out_size=width, width=128, seed=args.seed, **options
        ),
        data=train,
        validation=val,
        normalizer=norm,
        loss=loss,
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
        validate_every_n_steps=max(1, args.steps // 6),
        seed=0,
        progress=False,
    )
    artifact = loop.run()
    print(artifact.summary())

    # The head (and, for the mixture, its n_components/covariance) is inferred from the
    # loss and recorded; the loader gets distributions in θ's units.
    registry = LocalModelRegistry(out / "registry")
    artifact.register(registry, "two-moons-posterior")
    record, model = registry.load_record_and_model("two-moons-posterior")
    posterior = NeuralForward.from_record(record, model)

    rng = np.random.default_rng(0)
    observations, references, samples, scores, leakage = [], [], [], [], []
    for i, theta in enumerate(THETA_OBS):
        x_o = observation(theta, seed=100 + i)
        ref = reference_posterior(x_o, args.posterior_samples, rng)
        got, leak = posterior_samples(posterior, x_o, args.posterior_samples, rng)
        observations.append(x_o)
        references.append(ref)
        samples.append(got)
        scores.append(c2st(ref, got, seed=i))
        leakage.append(leak)
    plot(out / "posterior.png", observations, references, samples, scores, args.backend, args.head)
    elapsed = time.perf_counter() - started
    print(
        f"head {record.head!r} {record.head_options or ''}; C2ST per observation "
        f"{[round(s, 3) for s in scores]}, mean {np.mean(scores):.3f} (0.5 is perfect); "
        f"rejected outside the prior {np.round(leakage, 3).tolist()}; {elapsed:.0f} s"
    )
    print(f"figure: {out / 'posterior.png'}")
    return {
        "c2st": [float(s) for s in scores],
        "c2st_mean": float(np.mean(scores)),
        "leakage": [float(v) for v in leakage],
        # the share of draws in the mode θ1 + θ2 > 0 (exactly 1/2 in the true posterior)
        "mode_share": [float(np.mean(g.sum(axis=1) > 0)) for g in samples],
        "head": record.head,
        "head_options": record.head_options,
        "seconds": elapsed,
    }


if __name__ == "__main__":
    os.environ.setdefault("KERAS_BACKEND", "jax")
    main()
