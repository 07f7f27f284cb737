"""sbibm benchmark: C2ST of amortized posteriors against sbibm's reference posteriors
(not part of the test run).

```bash
uv run python benchmarks/bench_sbi.py                              # two_moons, slcp, 10k, flow
uv run python benchmarks/bench_sbi.py --tasks slcp --heads flow mixture --budgets 10000 100000
uv run python benchmarks/bench_sbi.py --backends equinox lightning torch keras --observations 1 2 3
uv run python benchmarks/bench_sbi.py --quick --json /tmp/sbi.json    # run_all convention
uv run python benchmarks/bench_sbi.py --tasks slcp --estimator nle --nle-points --steps 30000 \
    --patience 0 --jobs 10                                         # NLE, SMC draws
```

Tasks (`benchmarks/sbi_tasks`): sbibm's `two_moons`, `slcp` and `gaussian_mixture`,
simulators and uniform priors written in numpy from sbibm's definitions, with sbibm's
published observations 1–10 and reference posterior samples (vendored, MIT licence).

For each task × simulation budget × backend × head, one network is trained on
`budget` simulations (`seed` fixed: every head and backend sees the same simulations;
10% held out for validation) through the public API (`TrainingLoop` with
`losses.flow_nll` or `losses.mixture_nll`; `Normalizer` on θ), read as a posterior
(`artifact.posterior()`), and at each observation `--posterior-samples` draws inside the
prior box (a flow is truncated with `Flow.within(low, high)`; mixture draws outside the
box are rejected, as sbi does for a bounded prior) are compared with the same number of
sbibm's reference draws by `diagnostics.c2st` (sbibm's classifier: an MLP with two
hidden layers of 10·dim units, both sets z-scored with the reference's statistics, 5-fold
cross-validation). 0.5: indistinguishable; 1.0: told apart every time.

Networks: `two_moons` and `gaussian_mixture` use an MLP on x (`toymodels`, width 128,
depth 2). `slcp` reads its 8 values as a set of 4 i.i.d. 2-D points: `--embedding
deep_set` (default; the backend's `deep_set`: φ on each point, a mean, ρ to the head;
the points are z-scored per coordinate with statistics shared by all four, which keeps the
set's symmetry) or `--embedding mlp` (an MLP on the 8 values, z-scored by `Normalizer`).
Backend `torch` trains the `lightning` network with the lean `Torch()` adapter.

Training and scoring can run apart: `--sample-only --out DIR` trains and saves the
draws (`DIR/cases.json` and one `.npz` per case); `--score-only --out DIR --jobs N` reads
them and runs the C2STs in `N` processes (sbibm's 10 000 draws per side take minutes per
observation on one core), on a machine that needs only numpy, array_api_compat and
scikit-learn besides `pipekit_train.core`.

`--flow-hidden H` gives the flow head coupled layers (`losses.flow_nll(flow_hidden=H)`:
each layer's splines of the second half of θ conditioned on the first half through a small
network whose weights the head outputs); 0, the default, is the element-wise flow.
`--shared-conditioner` (Equinox, slcp, with `--flow-hidden`) is an experiment: the
conditioner's weights are learned constants shared by every observation, with only its
biases read from the DeepSet (sbi's design; `sbi_conditioner.py`).

`--symmetry`: use the task's known symmetries in θ (`Task.symmetries`, maps `θ → G θ`
that leave prior and likelihood unchanged: slcp's sign flips of θ₃ and θ₄, two_moons'
mirror `(θ₁, θ₂) → (-θ₂, -θ₁)`), which sbi's and sbibm's NPE do not use: `augment` trains
on every simulation under each symmetry (after the 90/10 split, so a simulation and its
images stay on one side; the same simulations, four times the training pairs on slcp);
`average` maps each posterior draw by a symmetry chosen at random (the identity
included), which makes the posterior exactly symmetric; `both` does both. Averaging maps
the draws when they are scored, so `--score-only --symmetry average` scores saved draws
under it. An experiment of the benchmark: it reads task knowledge a user may not have, so
its rows are not comparable with sbibm's.

`--theta-order P`: the flow sees θ's columns in the order `P` (a permutation; in a
coupled flow the first half of that order conditions the rest), and its draws are put
back in the task's order before they are saved.

`--members K`: K networks per case, trained on the same simulations with seeds `seed` …
`seed + K - 1` (member 0 is the single network of `--members 1`); the posterior is their
equal-weight mixture (`PosteriorEnsemble`), truncated to the prior box as a whole
(`Ensemble.within`: member k's share of the draws is proportional to its mass inside the
box). Training time is the members' sum.

`--patience N`: stop after N validations (every 250 updates) without a better validation
loss. The default, 4, is about 30 epochs of 9000 training simulations (10⁴); at 10⁵ sbi's
rule (20 epochs without improvement) is `--patience 28`, used for the 10⁵ table of
`docs/guides/sbi.md`.

`--estimator nle`: the flow head learns the likelihood instead (`sbi_nle.py`: an MLP on θ,
the flow over x; with `--nle-points`, over one of slcp's i.i.d. points, the observation's
log-likelihood the sum over its points), read as `LikelihoodPosterior` and drawn by
`smc_sample` per observation (`--jobs N`: in N processes, each loading the network from
a `LocalModelRegistry`). `--estimator exact`: the same sampler on slcp's exact
likelihood (the sampler's own error). `--heads`, `--embedding`, `--symmetry`,
`--members` and the flow's coupling options are NPE's and not read by these.

`--sbi`: when the `sbi` package is installed, its NPE (default neural spline flow,
default training) runs on the same simulations and is scored the same way (optional;
never a dependency). `--quick`: two_moons and slcp on Equinox, the flow head, 2 000
simulations, 400 updates, observations 1–2, 1 000 draws per side (a smoke run of the
whole path, not a result).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))

import sbi_nle  # noqa: E402
from _shared import backend_package, build_model_op, make_parser, row, write_rows  # noqa: E402
from sbi_fit import fit, mlp  # noqa: E402
from sbi_tasks import Task, get_task  # noqa: E402

#: sbibm's published mean C2ST of NPE over observations 1-10 (Lueckmann et al. 2021; the
#: `benchmarking_sbi/results/main_paper.csv` of github.com/sbi-benchmark/results):
#: (task, budget) -> value.
SBIBM_NPE = {
    ("two_moons", 10_000): 0.606,
    ("two_moons", 100_000): 0.542,
    ("slcp", 10_000): 0.901,
    ("slcp", 100_000): 0.831,
    ("gaussian_mixture", 10_000): 0.661,
    ("gaussian_mixture", 100_000): 0.555,
}
#: Validate (and check early stopping) every this many updates.
VALIDATE_EVERY = 250
#: The targets of issue 34: (task, budget) -> mean C2ST at most.
TARGETS = {("slcp", 10_000): 0.80, ("slcp", 100_000): 0.72, ("two_moons", 10_000): 0.58}


def _set_model(
    backend: str, out_size: int, seed: int, shared_conditioner: dict[str, int] | None = None
) -> Any:
    """The backend's `deep_set` (torch: Lightning's network, trained by `Torch()`)."""
    options = {"point_size": 2, "out_size": out_size, "embed_size": 64, "width": 128}
    options.update(depth=2, seed=seed)
    if shared_conditioner is not None:  # the experiment of `sbi_conditioner.py` (Equinox)
        factory = "sbi_conditioner:shared_conditioner_deep_set"
        return build_model_op(backend, factory, **options, **shared_conditioner)
    return build_model_op(backend, f"{backend_package(backend)}:deep_set", **options)


class Setting:
    """One trained posterior: the task, its inputs' transform and the network."""

    def __init__(self, task: Task, embedding: str, order: list[int] | None = None):
        self.task = task
        #: the network's θ is the task's θ[:, order] (None: the task's order)
        self.order = order
        self.as_set = task.point_size is not None and embedding == "deep_set"
        self.shift: np.ndarray | None = None
        self.scale: np.ndarray | None = None

    def inputs(self, x: np.ndarray) -> np.ndarray:
        """The network's input: the raw x, or the z-scored set `(n, points, point_size)`."""
        if not self.as_set:
            return x.astype(np.float32)
        size = int(self.task.point_size or 1)
        points = x.reshape(len(x), -1, size)
        if self.shift is None:
            self.shift = points.mean(axis=(0, 1))
            self.scale = points.std(axis=(0, 1))
        return ((points - self.shift) / self.scale).astype(np.float32)


def train(
    task: Task,
    theta: np.ndarray,
    x: np.ndarray,
    *,
    backend: str,
    head: str,
    embedding: str,
    steps: int,
    flow_layers: int,
    flow_bins: int,
    flow_hidden: int,
    components: int,
    seed: int,
    patience: int,
    shared_conditioner: bool = False,
    symmetry: str = "none",
    order: list[int] | None = None,
) -> tuple[Any, Setting, float, int]:
    """Train one posterior network; returns `(posterior, setting, seconds, updates)`."""

    from pipekit_train.core import Normalizer, losses
    from pipekit_train.core.data import ArrayDataset, split

    setting = Setting(task, embedding, order)
    inputs = setting.inputs(x)
    if order is not None:  # the flow sees θ in this order (its first half conditions the rest)
        theta = theta[:, order]
    data = ArrayDataset(x=inputs, y=theta.astype(np.float32))
    train_set, val_set = split(data, (0.9, 0.1), seed=0)
    if symmetry in ("augment", "both"):  # each part's simulations under every symmetry
        train_set, val_set = (
            ArrayDataset(
                x=np.concatenate([inputs[part.indices]] * len(task.group())),
                y=np.concatenate(
                    [theta[part.indices] @ _reordered(g, order).T for g in task.group()]
                ).astype(np.float32),
            )
            for part in (train_set, val_set)
        )
    keys = ("y",) if setting.as_set else ("x", "y")
    norm = Normalizer.fit(train_set, keys=keys)
    options: dict[str, Any] = {}
    if head == "flow":
        loss = losses.flow_nll(
            flow_layers=flow_layers, flow_bins=flow_bins, flow_bound=3.0, flow_hidden=flow_hidden
        )
        width = losses.flow_width(task.dim_theta, flow_layers, flow_bins, flow_hidden)
    else:
        loss = losses.mixture_nll(n_components=components, covariance="full")
        width = losses.mixture_width(components, task.dim_theta, "full")
        options = {"n_logits": components, "logit_scale": 0.03}
    if setting.as_set:
        flow = {"dim": task.dim_theta, "flow_layers": flow_layers, "flow_bins": flow_bins}
        flow["flow_hidden"] = flow_hidden
        model = _set_model(backend, width, seed, flow if shared_conditioner else None)
    else:
        model = mlp(backend, task.dim_x, width, seed, **options)
    artifact, seconds = fit(
        model,
        backend,
        train_set,
        val_set,
        norm,
        loss,
        steps=steps,
        seed=seed,
        patience=patience,
        validate_every=VALIDATE_EVERY,
    )
    posterior = artifact.posterior(state_ndim=2 if setting.as_set else 1)
    return posterior, setting, seconds, artifact.steps


def _likelihood_run(
    args: argparse.Namespace, task: Task, theta: np.ndarray, x: np.ndarray, backend: str
) -> tuple[str, list[Any], str, float, int]:
    """One `--estimator nle` case: the likelihood network of `sbi_nle`, trained."""
    iid = args.nle_points and task.point_size is not None
    print(f"{task.name}, {len(theta)} simulations, {backend}, NLE", flush=True)
    likelihood, artifact, seconds = sbi_nle.train_likelihood(
        task,
        theta,
        x,
        backend=backend,
        steps=args.steps,
        flow_layers=args.flow_layers,
        flow_bins=args.flow_bins,
        seed=args.seed,
        patience=args.patience,
        iid=iid,
        validate_every=VALIDATE_EVERY,
    )
    label = f"{backend}, NLE{' per point' if iid else ''} (flow), SMC"
    likelihood.artifact = artifact  # registered when the draws run in processes (--jobs)
    return label, [likelihood], "smc", seconds, artifact.steps


def _parallel_smc(
    args: argparse.Namespace, task: Task, likelihood: Any, case: str, out: Path
) -> tuple[dict[str, np.ndarray], list[float]]:
    """SMC draws at every observation in `--jobs` processes; the network goes to them
    through a `LocalModelRegistry` under `out` (slcp's exact likelihood needs none)."""
    root, name = str(out / "registry"), ""
    if hasattr(likelihood, "artifact"):
        name = _slug(case)
        sbi_nle.register(likelihood.artifact, root, name)
    jobs = [
        (root, name, task.name, k, args.posterior_samples, likelihood_points(likelihood))
        for k in args.observations
    ]
    got = sbi_nle.parallel_draws(jobs, args.jobs)
    saved = {
        f"obs{k}": np.asarray(g, dtype=np.float32)
        for k, g in zip(args.observations, got, strict=True)
    }
    return saved, [0.0] * len(got)


def likelihood_points(likelihood: Any) -> int | None:
    """The i.i.d. point size a likelihood was trained on (None: all of x)."""
    return getattr(likelihood, "point_size", None)


def _reordered(g: np.ndarray, order: list[int] | None) -> np.ndarray:
    """The symmetry `g` acting on θ[:, order]."""
    return g if order is None else g[np.ix_(order, order)]


def draws(posteriors: list[Any], setting: Setting, x_o: np.ndarray, n: int, seed: int) -> tuple:
    """`n` draws at `x_o` inside the prior box, and the share of the mass outside it: of
    one network's posterior, or of several networks' `PosteriorEnsemble`."""
    from pipekit_train.core import PosteriorEnsemble

    posterior = posteriors[0] if len(posteriors) == 1 else PosteriorEnsemble(posteriors)
    dist = posterior.distribution(setting.inputs(x_o[None])[0])
    got, outside = _draws(dist, setting.task, np.random.default_rng(seed), n)
    if setting.order is not None:  # back to the task's order
        got = np.asarray(got)[:, np.argsort(setting.order)]
    return got, outside


def _draws(dist: Any, task: Task, rng: np.random.Generator, n: int) -> tuple:
    """`n` draws of one distribution inside the prior box, and its share outside it."""
    if callable(getattr(dist, "within", None)):  # a Flow, or an Ensemble of flows
        outside = 1.0 - float(dist.within(task.low, task.high).acceptance)
        return np.asarray(dist.within(task.low, task.high).sample(rng, n)), outside
    kept, total, drawn = [], 0, 0
    while total < n:
        got = np.asarray(dist.sample(rng, 2 * (n - total) + 256), dtype=np.float64)
        inside = got[task.inside(got)]
        kept.append(inside)
        total += len(inside)
        drawn += len(got)
    return np.concatenate(kept)[:n], 1.0 - total / drawn


def sbi_npe(task: Task, theta: np.ndarray, x: np.ndarray, seed: int) -> Any:
    """sbi's NPE (its defaults) on the same simulations, or None without `sbi`."""
    try:
        import torch
        from sbi.inference import NPE
        from sbi.utils import BoxUniform
    except ImportError:
        return None
    import contextlib

    torch.manual_seed(seed)
    low = torch.full((task.dim_theta,), task.low)
    prior = BoxUniform(low=low, high=torch.full((task.dim_theta,), task.high))
    # sbi's default summary writer puts `sbi-logs/` in the working directory: not the repo's
    with tempfile.TemporaryDirectory() as logs, contextlib.chdir(logs):
        inference = NPE(prior=prior)
        inference.append_simulations(
            torch.as_tensor(theta, dtype=torch.float32), torch.as_tensor(x, dtype=torch.float32)
        )
        return inference.build_posterior(inference.train())


def symmetrized(task: Task, got: np.ndarray, seed: int) -> np.ndarray:
    """Each draw mapped by one of the task's symmetries (the identity included), chosen at
    random: the draws of the symmetrized posterior (`--symmetry average`)."""
    group = np.stack(task.group())
    pick = np.random.default_rng([seed, 0x53594D]).integers(len(group), size=len(got))
    return np.einsum("nij,nj->ni", group[pick], got).astype(got.dtype)


def c2st_score(job: tuple[str, int, str, int, bool]) -> float:
    """C2ST of one saved draw set against its reference (a process pool runs these)."""
    from pipekit_train.core import diagnostics

    task, k, path, n, average = job
    with np.load(path) as saved:
        got = saved[f"obs{k}"][:n]
    if average:
        got = symmetrized(get_task(task), got, k)
    started = time.perf_counter()
    score = diagnostics.c2st(get_task(task).reference(k)[:n], got, seed=k, folds=5)
    took = time.perf_counter() - started
    name = Path(path).stem + ("_symmetry_average" if average else "")
    print(f"    {name}, observation {k}: C2ST {score:.4f} ({took:.0f} s)", flush=True)
    return score


def _slug(case: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in case).strip("_")


def sample_all(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """Train every case, save its draws at every observation to `out`; return the cases."""
    cases: list[dict[str, Any]] = []
    for name in args.tasks:
        task = get_task(name)
        for budget in args.budgets:
            theta, x = task.simulate(budget, seed=args.seed + 1)
            runs: list[tuple[str, Any, Setting | None, float, int]] = []
            for backend in args.backends if args.estimator == "nle" else []:
                runs.append(_likelihood_run(args, task, theta, x, backend))
            if args.estimator == "exact":
                runs = [("exact likelihood, SMC", [sbi_nle.ExactPosterior(task)], "smc", 0.0, 0)]
            for backend in args.backends if args.estimator == "npe" else []:
                for head in args.heads:
                    print(f"{name}, {budget} simulations, {backend}, {head} head", flush=True)
                    members = [
                        train(
                            task,
                            theta,
                            x,
                            backend=backend,
                            head=head,
                            embedding=args.embedding,
                            steps=args.steps,
                            flow_layers=args.flow_layers,
                            flow_bins=args.flow_bins,
                            flow_hidden=args.flow_hidden,
                            components=args.components,
                            seed=args.seed + m,
                            patience=args.patience,
                            shared_conditioner=args.shared_conditioner,
                            symmetry=args.symmetry,
                            order=args.theta_order,
                        )
                        for m in range(args.members)
                    ]
                    setting = members[0][1]
                    seconds = sum(member[2] for member in members)
                    steps = sum(member[3] for member in members)
                    coupled = f" (flow_hidden={args.flow_hidden})" if head == "flow" else ""
                    label = f"{backend}, {head}{coupled if args.flow_hidden else ''}"
                    if args.shared_conditioner:
                        label += ", shared conditioner"
                    if args.members > 1:
                        label += f", {args.members}-member ensemble"
                    if args.symmetry in ("augment", "both"):
                        label += ", symmetry augment"
                    if args.theta_order:
                        label += f", theta order {''.join(map(str, args.theta_order))}"
                    posteriors = [member[0] for member in members]
                    runs.append((label, posteriors, setting, seconds, steps))
            if args.sbi:
                started = time.perf_counter()
                npe = sbi_npe(task, theta, x, args.seed)
                if npe is None:
                    print("    sbi is not installed: no NPE comparison", flush=True)
                else:
                    runs.append(("sbi NPE", [npe], None, time.perf_counter() - started, 0))
            for label, posteriors, setting, seconds, steps_done in runs:
                embedding = (
                    f", {args.embedding}"
                    if task.point_size and isinstance(setting, Setting)
                    else ""
                )
                case = f"{name}, {budget} sims, {label}{embedding}"
                saved, outside = {}, []
                if setting == "smc" and args.jobs > 1:  # SMC per observation, in processes
                    saved, outside = _parallel_smc(args, task, posteriors[0], case, out)
                for k in args.observations if not saved else []:
                    x_o = task.observation(k)
                    if setting == "smc":  # a likelihood (NLE, or slcp's exact one): SMC draws
                        started = time.perf_counter()
                        got, leak = posteriors[0].sample(x_o, args.posterior_samples, seed=k), 0.0
                        print(f"    SMC at observation {k}: {time.perf_counter() - started:.0f} s")
                    elif setting is None:  # sbi's posterior
                        import torch

                        got = (
                            posteriors[0]
                            .sample(
                                (args.posterior_samples,),
                                x=torch.as_tensor(x_o, dtype=torch.float32),
                            )
                            .numpy()
                        )
                        leak = float("nan")
                    else:
                        got, leak = draws(posteriors, setting, x_o, args.posterior_samples, k)
                    saved[f"obs{k}"] = np.asarray(got, dtype=np.float32)
                    outside.append(leak)
                path = out / f"{_slug(case)}.npz"
                np.savez_compressed(path, **saved)
                cases.append(
                    {
                        "case": case,
                        "task": name,
                        "budget": budget,
                        "path": path.name,
                        "seconds": seconds,
                        "outside": outside,
                        "observations": list(args.observations),
                        "samples": args.posterior_samples,
                        "steps": steps_done,
                        "average": args.symmetry in ("average", "both") and setting is not None,
                    }
                )
                (out / "cases.json").write_text(json.dumps(cases, indent=1))
    return cases


def score_all(
    cases: list[dict[str, Any]],
    out: Path,
    jobs: int,
    samples: int | None = None,
    average: bool = False,
) -> list[dict[str, Any]]:
    """C2ST of every saved draw set (in `jobs` processes; the first `samples` draws of each
    side when given; the draws mapped by random symmetries where the case says so, or every
    case's when `average`); the result rows."""
    for c in cases:
        c["samples"] = min(c["samples"], samples or c["samples"])
        c["average"] = c.get("average", False) or average
        if c["average"] and not c["case"].endswith("symmetry average"):
            c["case"] += ", symmetry average"
    work = [
        (c["task"], k, str(out / c["path"]), c["samples"], c["average"])
        for c in cases
        for k in c["observations"]
    ]
    if jobs > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # spawned, not forked: this process may have started JAX's threads
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(jobs, mp_context=spawn) as pool:
            scores = list(pool.map(c2st_score, work))
    else:
        scores = [c2st_score(job) for job in work]
    rows, at = [], 0
    for c in cases:
        obs = c["observations"]
        got = scores[at : at + len(obs)]
        at += len(obs)
        mean = float(np.mean(got))
        key = (c["task"], c["budget"])
        target, reference = TARGETS.get(key), SBIBM_NPE.get(key)
        per_obs = ", ".join(f"{s:.3f}" for s in got)
        print(
            f"  {c['case']}: C2ST mean {mean:.3f} over observations {obs} [{per_obs}]; "
            f"mass outside the prior {np.round(c['outside'], 3).tolist()}; training "
            f"{c['seconds']:.0f} s; {c['steps']} updates (sbibm NPE: {reference})",
            flush=True,
        )
        rows.append(
            row(
                "sbi",
                c["case"],
                f"mean C2ST, observations {obs[0]}-{obs[-1]}, {c['samples']} draws per side",
                mean,
                "accuracy",
                ratio=None if reference is None else mean / reference,
                target=None if target is None else f"<= {target}",
                ok=None if target is None or c["samples"] < 10_000 else mean <= target,
                note=f"per observation [{per_obs}]; training {c['seconds']:.0f} s; "
                f"{c['steps']} updates; ratio: to sbibm's NPE ({reference})",
            )
        )
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = make_parser(
        __doc__,
        quick_help="two_moons and slcp on Equinox, the flow head, 2000 simulations, 400 "
        "updates, observations 1 and 2, 1000 draws per side",
    )
    parser.add_argument("--tasks", nargs="+", default=["two_moons", "slcp"])
    parser.add_argument("--heads", nargs="+", default=["flow"], choices=["flow", "mixture"])
    parser.add_argument("--budgets", nargs="+", type=int, default=[10_000])
    parser.add_argument(
        "--backends",
        nargs="+",
        default=["equinox"],
        choices=["equinox", "lightning", "torch", "keras"],
    )
    parser.add_argument("--observations", nargs="+", type=int, default=list(range(1, 11)))
    parser.add_argument("--embedding", default="deep_set", choices=["deep_set", "mlp"])
    parser.add_argument("--steps", type=int, default=10_000, help="optimizer updates")
    parser.add_argument("--flow-layers", type=int, default=5)
    parser.add_argument("--flow-bins", type=int, default=8)
    parser.add_argument(
        "--flow-hidden",
        type=int,
        default=0,
        help="the flow's coupling conditioner units per layer (0: element-wise layers)",
    )
    parser.add_argument(
        "--shared-conditioner",
        action="store_true",
        help="with --flow-hidden: W1, W2 shared across observations (sbi_conditioner.py)",
    )
    parser.add_argument(
        "--symmetry",
        default="none",
        choices=["none", "augment", "average", "both"],
        help="use the task's known symmetries: train on every simulation under each "
        "(augment), draw under a random one (average), or both",
    )
    parser.add_argument(
        "--theta-order",
        type=int,
        nargs="+",
        help="the order the flow sees θ's columns in (a permutation; the first half "
        "conditions the rest in a coupled flow)",
    )
    parser.add_argument(
        "--estimator",
        default="npe",
        choices=["npe", "nle", "exact"],
        help="npe: the flow head on θ given x (default); nle: the flow head on x given θ, "
        "drawn by SMC (sbi_nle.py); exact: slcp's exact likelihood, drawn by SMC",
    )
    parser.add_argument(
        "--nle-points",
        action="store_true",
        help="with --estimator nle: learn one i.i.d. point's likelihood (slcp)",
    )
    parser.add_argument("--components", type=int, default=10, help="mixture components")
    parser.add_argument(
        "--posterior-samples", type=int, default=10_000, help="draws per side for C2ST"
    )
    parser.add_argument(
        "--patience",
        type=int,
        default=4,
        help=f"stop after this many validations (every {VALIDATE_EVERY} updates) without a "
        "better val_loss (0: train all --steps)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--members",
        type=int,
        default=1,
        help="networks per case, trained on the same simulations with seeds seed..seed+K-1; "
        "the posterior is their equal-weight mixture",
    )
    parser.add_argument("--sbi", action="store_true", help="also run sbi's NPE if installed")
    parser.add_argument("--out", help="folder for the draws (default: a temporary one)")
    parser.add_argument("--sample-only", action="store_true", help="train and save draws only")
    parser.add_argument("--score-only", action="store_true", help="score the draws in --out")
    parser.add_argument("--jobs", type=int, default=1, help="processes for the C2ST scores")
    parser.add_argument(
        "--c2st-samples", type=int, help="with --score-only: score the first N draws per side"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.tasks, args.heads, args.budgets = ["two_moons", "slcp"], ["flow"], [2000]
        args.backends, args.observations = ["equinox"], [1, 2]
        args.steps, args.posterior_samples = 400, 1000
    os.environ.setdefault("KERAS_BACKEND", "jax")
    if args.shared_conditioner and (
        args.flow_hidden < 1
        or args.heads != ["flow"]
        or args.backends != ["equinox"]
        or args.embedding != "deep_set"
        or args.tasks != ["slcp"]
    ):
        parser.error(
            "--shared-conditioner is an Equinox experiment on slcp's DeepSet with the coupled "
            f"flow. Received: flow_hidden={args.flow_hidden}, heads={args.heads}, "
            f"backends={args.backends}, embedding={args.embedding!r}, tasks={args.tasks}. "
            "Pass --tasks slcp --heads flow --backends equinox --flow-hidden H (H > 0)."
        )
    no_symmetry = [name for name in args.tasks if not get_task(name).symmetries]
    if args.symmetry != "none" and no_symmetry:
        parser.error(
            f"--symmetry needs tasks with known symmetries (two_moons, slcp). Received: "
            f"symmetry={args.symmetry!r}, tasks={args.tasks}, but {no_symmetry} have none. "
            "Drop those tasks or pass --symmetry none."
        )
    if args.theta_order is not None:
        dims = {get_task(name).dim_theta for name in args.tasks}
        if len(dims) != 1 or sorted(args.theta_order) != list(range(dims.pop())):
            parser.error(
                "--theta-order must be a permutation of one task's parameter indices. "
                f"Received: theta_order={args.theta_order}, tasks={args.tasks}. Pass e.g. "
                "--tasks slcp --theta-order 2 3 0 1 4."
            )
    if (args.sample_only or args.score_only) and not args.out:
        parser.error("--sample-only and --score-only need --out DIR")
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(args.out or scratch)
        out.mkdir(parents=True, exist_ok=True)
        if args.score_only:
            cases = json.loads((out / "cases.json").read_text())
        else:
            cases = sample_all(args, out)
        average = args.score_only and args.symmetry in ("average", "both")
        rows = (
            []
            if args.sample_only
            else score_all(cases, out, args.jobs, args.c2st_samples, average=average)
        )
    if args.json:
        write_rows(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
