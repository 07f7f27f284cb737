"""Neural likelihood estimation for the sbibm benchmark (`bench_sbi.py --estimator nle`).

NPE learns `p(θ | x)` and is sampled directly. NLE (Papamakarios et al. 2019, sbibm's
`NLE`) learns the likelihood `q(x | θ)` with the same flow head and draws the posterior
`p(θ | x_o) ∝ prior(θ) q(x_o | θ)` by a sampler. Here:

- **The likelihood network.** An MLP on θ (`toymodels`, width 128, depth 2) with the flow
  head over x, trained through the public API (`TrainingLoop`, `losses.flow_nll`,
  `Normalizer` on θ and x), read back as `artifact.posterior()` (its `distribution(θ)` is
  a `Flow` over x in x's units).
- **I.i.d. points** (`--nle-points`, tasks with `point_size`, i.e. slcp): the network
  learns one point's density `q(x_i | θ)` from every point of every simulation (4
  training pairs per slcp simulation), and the likelihood of an observation is the
  product over its points, `sum_i log q(x_i | θ)` (what sbi calls NLE on i.i.d. trials).
  This reads the task's structure (its points are independent given θ) and is not
  comparable with sbibm's NLE, which models the 8 values jointly (the default here too).
- **The sampler** (`smc`): sequential Monte Carlo from the prior to the posterior
  (likelihood tempering `prior · q^β`, `β` from 0 to 1, each step chosen so that the
  effective sample size falls to half; systematic resampling; random-walk Metropolis moves
  whose proposal covariance is that of the particle's cluster, so that several modes
  keep their own scales). Particles start from the prior, so every mode is found without
  a starting point. The same sampler on the task's exact likelihood
  (`--estimator exact`, slcp only) measures the sampler's own error against sbibm's
  reference.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from sbi_tasks import Task

__all__ = ["ExactPosterior", "box", "slcp_log_likelihood", "train_likelihood"]


def _points(task: Task, x: np.ndarray, iid: bool) -> np.ndarray:
    """x as `(n, points, size)`: the task's i.i.d. points, or one point of all x."""
    size = task.point_size if iid and task.point_size else task.dim_x
    return np.asarray(x, dtype=np.float64).reshape(len(x), -1, size)


def train_likelihood(
    task: Task,
    theta: np.ndarray,
    x: np.ndarray,
    *,
    backend: str,
    steps: int,
    flow_layers: int,
    flow_bins: int,
    seed: int,
    patience: int,
    iid: bool,
    validate_every: int,
) -> tuple[Any, Any, float]:
    """Train `q(x | θ)`; returns `(LikelihoodPosterior, artifact, seconds)`."""
    from sbi_fit import fit, mlp

    from pipekit_train.core import LikelihoodPosterior, Normalizer, losses
    from pipekit_train.core.data import ArrayDataset, split

    points = _points(task, x, iid)
    n, count, size = points.shape
    whole = ArrayDataset(x=theta.astype(np.float32), y=points.astype(np.float32))
    parts = split(whole, (0.9, 0.1), seed=0)  # by simulation: its points stay on one side
    train_set, val_set = (
        ArrayDataset(
            x=np.repeat(theta[part.indices], count, axis=0).astype(np.float32),
            y=points[part.indices].reshape(-1, size).astype(np.float32),
        )
        for part in parts
    )
    norm = Normalizer.fit(train_set, keys=("x", "y"))
    width = losses.flow_width(size, flow_layers, flow_bins)
    model = mlp(backend, task.dim_theta, width, seed)
    loss = losses.flow_nll(flow_layers=flow_layers, flow_bins=flow_bins, flow_bound=3.0)
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
        validate_every=validate_every,
        what="the likelihood: ",
    )
    point_size = size if iid else None
    likelihood = LikelihoodPosterior(artifact.posterior(), box(task), point_size=point_size)
    return likelihood, artifact, seconds


def slcp_log_likelihood(x_o: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """slcp's exact `log p(x_o | θ)` (four 2-D Gaussian points; `sbi_tasks._slcp`)."""
    points = np.asarray(x_o, dtype=np.float64).reshape(4, 2)

    def log_p(theta: np.ndarray) -> np.ndarray:
        s1, s2, rho = theta[:, 2] ** 2, theta[:, 3] ** 2, np.tanh(theta[:, 4])
        v1, v2, c = s1**2 + 1e-6, s2**2 + 1e-6, rho * s1 * s2
        det = v1 * v2 - c**2
        dx = points[None, :, 0] - theta[:, None, 0]
        dy = points[None, :, 1] - theta[:, None, 1]
        quad = (v2[:, None] * dx**2 - 2 * c[:, None] * dx * dy + v1[:, None] * dy**2) / det[:, None]
        return np.sum(-0.5 * quad - 0.5 * np.log(det)[:, None] - np.log(2 * np.pi), axis=1)

    return log_p


class ExactPosterior:
    """slcp's exact likelihood and prior, drawn by `smc_sample` (`--estimator exact`)."""

    def __init__(self, task: Task):
        self.task = task

    def sample(self, x: np.ndarray, n: int, *, seed: int = 0, **smc_options: Any) -> np.ndarray:
        from pipekit_train.core import smc_sample

        return smc_sample(slcp_log_likelihood(x), box(self.task), n, seed=seed, **smc_options)


def box(task: Task) -> Any:
    """The task's prior as a `BoxPrior`."""
    from pipekit_train.core import BoxPrior

    return BoxPrior([task.low] * task.dim_theta, [task.high] * task.dim_theta)


def register(artifact: Any, root: str, name: str) -> None:
    """Hand the likelihood network to a `LocalModelRegistry` at `root` (for `smc_job`)."""
    from pipekit_train.core import LocalModelRegistry

    artifact.register(LocalModelRegistry(root), name)


def _worker_start() -> None:
    """A sampling process runs on the CPU (the accelerator stays with the parent)."""
    import os

    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.setdefault("KERAS_BACKEND", "jax")
    # one thread each: the processes share the cores
    os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def smc_job(job: tuple[str, str, str, int, int, int | None]) -> np.ndarray:
    """SMC draws at one observation, in a process of its own: the likelihood is loaded
    from the registry (`root`, `name`; `name` "" is slcp's exact likelihood)."""
    from sbi_tasks import get_task

    from pipekit_train.core import LikelihoodPosterior, LocalModelRegistry, NeuralForward

    root, name, task_name, k, n, point_size = job
    task = get_task(task_name)
    if not name:
        return ExactPosterior(task).sample(task.observation(k), n, seed=k)
    import toymodels  # noqa: F401  (its `@model_factory` marks the stored factory trusted)

    record, op = LocalModelRegistry(root).load_record_and_model(name)
    posterior = LikelihoodPosterior(
        NeuralForward.from_record(record, op), box(task), point_size=point_size
    )
    started = time.perf_counter()
    got = posterior.sample(task.observation(k), n, seed=k)
    print(f"    SMC at observation {k}: {time.perf_counter() - started:.0f} s", flush=True)
    return got


def parallel_draws(jobs: list, processes: int) -> list[np.ndarray]:
    """`smc_job` over `jobs` in `processes` fresh (spawned) processes."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(processes, mp_context=context, initializer=_worker_start) as pool:
        return list(pool.map(smc_job, jobs))
