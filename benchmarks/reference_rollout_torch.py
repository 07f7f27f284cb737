"""A hand-written k-step rollout training of the Lorenz-96 emulator in plain PyTorch.

The torch twin of `reference_rollout_optax.py`: the reference that
`bench_rollout_training.py` holds the library's `TrainingLoop(rollout=Rollout(steps=k,
residual=True), adapter=Torch())` against (issue 32, "reference runs"). No pipekit code:
numpy for the data and statistics, a `torch.nn.Sequential` of `Linear` and `Tanh`,
`torch.optim.Adam`, an eager loop. The same problem as the optax reference, step by step:

- **Data.** Windows of `k + 1` consecutive states of every training trajectory (stride
  1), as one array `(n_windows, k + 1, d)`; one epoch is a permutation of the windows
  from `np.random.default_rng(seed)`, cut into batches (the last partial batch dropped).
  The same windows in the same order as the optax reference for the same seed.
- **Statistics.** Per variable (channel), pooled over trajectories and time, in float64:
  the mean and standard deviation of the states and of the one-step increments.
- **The step.** `next = x + model((x - mean_x) / std_x) * std_dx + mean_dx`: the model
  predicts the normalised increment (a residual emulator).
- **The loss.** The `k` steps are unrolled from the window's first state; step `i`'s loss
  is the mean squared error between the predicted and the true state, both normalised
  with the state statistics; the update minimises the mean of the `k` losses
  (backpropagation through all of them).
- **The model.** `d -> width x depth -> d` with tanh, built under `torch.manual_seed(seed)`
  with torch's default initialisation (uniform `±1/sqrt(fan_in)`), layers created in
  order: the same initial weights as `TorchModelOp("pipekit_train.lightning.testing:
  mlp", ..., seed=seed)`. They differ from the optax reference's (`PRNGKey(seed)`), which
  draws from another generator.

`train(...)` calls `on_update(i, loss)` after update `i` (1-based; on the CPU the update
has finished by then); `rollout(...)` advances states with the trained model, without
gradients, for the errors per lead time. Thread settings (`torch.set_num_threads`) are
the caller's.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

__all__ = ["Stats", "fit_stats", "make_mlp", "rollout", "train", "windows"]

Stats = dict[str, np.ndarray]  # "mean_x", "std_x", "mean_dx", "std_dx": (d,) float64


def fit_stats(trajectories: np.ndarray) -> Stats:
    """Per-variable statistics of states and increments of `(n, T, d)` trajectories."""
    states = trajectories.astype(np.float64)
    d = states.shape[-1]
    increments = np.diff(states, axis=1).reshape(-1, d)
    flat = states.reshape(-1, d)
    return {
        "mean_x": flat.mean(axis=0),
        "std_x": flat.std(axis=0),
        "mean_dx": increments.mean(axis=0),
        "std_dx": increments.std(axis=0),
    }


def windows(trajectories: np.ndarray, k: int) -> np.ndarray:
    """Every window of `k + 1` consecutive states, `(n * (T - k), k + 1, d)`, float32."""
    n, length, d = trajectories.shape
    idx = np.arange(length - k)[:, None] + np.arange(k + 1)[None, :]
    return trajectories[:, idx].reshape(n * (length - k), k + 1, d).astype(np.float32)


def make_mlp(d: int, width: int, depth: int, seed: int) -> torch.nn.Sequential:
    """A tanh MLP `d -> width x depth -> d`, initialised under `torch.manual_seed(seed)`."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers: list[torch.nn.Module] = []
        size = d
        for _ in range(depth):
            layers += [torch.nn.Linear(size, width), torch.nn.Tanh()]
            size = width
        layers.append(torch.nn.Linear(size, d))
        return torch.nn.Sequential(*layers)


def _constants(stats: Stats) -> tuple[torch.Tensor, ...]:
    keys = ("mean_x", "std_x", "mean_dx", "std_dx")
    return tuple(torch.as_tensor(stats[key], dtype=torch.float32) for key in keys)


def train(
    trajectories: np.ndarray,
    *,
    k: int,
    updates: int,
    batch_size: int,
    lr: float,
    width: int,
    depth: int,
    seed: int,
    on_update: Callable[[int, torch.Tensor], None] | None = None,
) -> tuple[torch.nn.Sequential, Stats]:
    """Train a residual emulator through `k`-step rollouts for `updates` adam updates.

    Args:
        trajectories: training trajectories `(n, T, d)`.
        k: the rollout length of every update.
        updates: the number of optimizer updates.
        batch_size: windows per update.
        lr: adam's learning rate (constant).
        width, depth: the MLP's hidden layers.
        seed: the seed of the initial weights and of the batch order.
        on_update: called with the update's number (1-based) and its loss (a detached
            tensor) after each update.

    Returns:
        The trained model and the statistics it is used with.
    """
    stats = fit_stats(trajectories)
    mx, sx, mdx, sdx = _constants(stats)
    data = windows(trajectories, k)
    model = make_mlp(trajectories.shape[-1], width, depth, seed)
    optim = torch.optim.Adam(model.parameters(), lr=lr)

    rng = np.random.default_rng(seed)
    per_epoch = len(data) // batch_size
    order = rng.permutation(len(data))
    for i in range(updates):
        j = i % per_epoch
        if i and j == 0:
            order = rng.permutation(len(data))
        window = torch.from_numpy(data[order[j * batch_size : (j + 1) * batch_size]])
        x = window[:, 0]
        total = torch.zeros(())
        for step in range(1, k + 1):
            x = x + model((x - mx) / sx) * sdx + mdx
            total = total + torch.mean(((x - window[:, step]) / sx) ** 2)
        loss = total / k
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        if on_update is not None:
            on_update(i + 1, loss.detach())
    return model, stats


def rollout(model: torch.nn.Module, stats: Stats, x0: np.ndarray, n_steps: int) -> np.ndarray:
    """States `(n_steps + 1, n, d)` of a rollout of `n` states with the trained emulator."""
    mx, sx, mdx, sdx = _constants(stats)
    x = torch.as_tensor(np.asarray(x0, np.float32))
    states = [x]
    with torch.no_grad():
        for _ in range(n_steps):
            x = x + model((x - mx) / sx) * sdx + mdx
            states.append(x)
    return torch.stack(states).numpy()
