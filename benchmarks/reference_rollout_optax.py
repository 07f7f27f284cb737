"""A hand-written k-step rollout training of the Lorenz-96 emulator in plain Equinox + optax.

The reference that `bench_rollout_training.py` holds the library's
`TrainingLoop(rollout=Rollout(steps=k, residual=True))` against (issue 32, "reference
runs"). No pipekit code: numpy for the data and statistics, an `eqx.nn.MLP`, optax's
adam, one `jax.jit`-ed update over the model's arrays (`eqx.partition`), donated. What a careful user writes by hand:

- **Data.** Windows of `k + 1` consecutive states of every training trajectory (stride
  1), as one array `(n_windows, k + 1, d)`; one epoch is a permutation of the windows
  from `np.random.default_rng(seed)`, cut into batches (the last partial batch dropped).
- **Statistics.** Per variable (channel), pooled over trajectories and time, in float64:
  the mean and standard deviation of the states and of the one-step increments.
- **The step.** `next = x + model((x - mean_x) / std_x) * std_dx + mean_dx`: the model
  predicts the normalised increment (a residual emulator).
- **The loss.** The `k` steps are unrolled from the window's first state; step `i`'s loss
  is the mean squared error between the predicted and the true state, both normalised
  with the state statistics; the update minimises the mean of the `k` losses
  (backpropagation through all of them).

`train(...)` calls `on_update(i, loss)` after dispatching update `i` (1-based), so a
benchmark can time a range of updates (waiting for that loss where it reads the clock); `rollout(...)` advances states with the trained model (one jitted
`lax.scan`) for the errors per lead time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

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


def make_mlp(d: int, width: int, depth: int, seed: int) -> eqx.nn.MLP:
    """A tanh MLP `d -> width x depth -> d` initialised from `jax.random.PRNGKey(seed)`."""
    return eqx.nn.MLP(d, d, width, depth, activation=jax.nn.tanh, key=jax.random.PRNGKey(seed))


def _constants(stats: Stats) -> tuple[jax.Array, ...]:
    keys = ("mean_x", "std_x", "mean_dx", "std_dx")
    return tuple(jnp.asarray(stats[key], jnp.float32) for key in keys)


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
    on_update: Callable[[int, jax.Array], None] | None = None,
) -> tuple[eqx.nn.MLP, Stats]:
    """Train a residual emulator through `k`-step rollouts for `updates` adam updates.

    Args:
        trajectories: training trajectories `(n, T, d)`.
        k: the rollout length of every update.
        updates: the number of optimizer updates.
        batch_size: windows per update.
        lr: adam's learning rate (constant).
        width, depth: the MLP's hidden layers.
        seed: the seed of the initial weights and of the batch order.
        on_update: called with the update's number (1-based) and its loss (a device
            array, not waited for) after each update is dispatched.

    Returns:
        The trained model and the statistics it is used with.
    """
    stats = fit_stats(trajectories)
    mx, sx, mdx, sdx = _constants(stats)
    data = windows(trajectories, k)
    params, static = eqx.partition(
        make_mlp(trajectories.shape[-1], width, depth, seed), eqx.is_array
    )
    optim = optax.adam(lr)
    opt_state = optim.init(params)

    def loss_fn(params: Any, window: jax.Array) -> jax.Array:
        model = eqx.combine(params, static)
        x = window[:, 0]
        total = jnp.zeros(())
        for i in range(1, k + 1):
            x = x + jax.vmap(model)((x - mx) / sx) * sdx + mdx
            total = total + jnp.mean(((x - window[:, i]) / sx) ** 2)
        return total / k

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def update(params: Any, opt_state: Any, window: jax.Array) -> tuple[Any, Any, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, window)
        changes, opt_state = optim.update(grads, opt_state, params)
        return optax.apply_updates(params, changes), opt_state, loss

    rng = np.random.default_rng(seed)
    per_epoch = len(data) // batch_size
    order = rng.permutation(len(data))
    for i in range(updates):
        j = i % per_epoch
        if i and j == 0:
            order = rng.permutation(len(data))
        batch = data[order[j * batch_size : (j + 1) * batch_size]]
        params, opt_state, loss = update(params, opt_state, batch)
        if on_update is not None:
            on_update(i + 1, loss)
    return eqx.combine(params, static), stats


def rollout(model: eqx.nn.MLP, stats: Stats, x0: np.ndarray, n_steps: int) -> np.ndarray:
    """States `(n_steps + 1, n, d)` of a rollout of `n` states with the trained emulator."""
    mx, sx, mdx, sdx = _constants(stats)

    @eqx.filter_jit
    def scan(model: Any, x0: jax.Array) -> jax.Array:
        def body(x: jax.Array, _: Any) -> tuple[jax.Array, jax.Array]:
            x = x + jax.vmap(model)((x - mx) / sx) * sdx + mdx
            return x, x

        return jax.lax.scan(body, x0, None, length=n_steps)[1]

    x0 = np.asarray(x0, np.float32)
    return np.concatenate([x0[None], np.asarray(scan(model, jnp.asarray(x0)))])
