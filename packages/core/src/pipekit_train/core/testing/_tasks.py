"""Shared toy tasks of the conformance suite: linear regression, a damped oscillator and a
noisy two-value conditional density for the flow head."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "FLOW_HEAD",
    "damped_oscillator_step",
    "flow_task",
    "oscillator_task",
    "regression_task",
]

# the flow head the conformance suite resumes: small, so a kill-and-resume stays fast
FLOW_HEAD: dict[str, Any] = {"flow_layers": 2, "flow_bins": 4, "flow_bound": 3.0}


def regression_task(
    n_train: int = 256, n_val: int = 64, in_size: int = 4, out_size: int = 1, seed: int = 0
) -> tuple[Any, Any]:
    """`y = x @ W + 0.5 + small noise`, float32; returns `(train, validation)` ArrayDatasets."""
    from pipekit_train.core.data import ArrayDataset

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((in_size, out_size))
    x = rng.standard_normal((n_train + n_val, in_size))
    y = x @ w + 0.5 + 0.01 * rng.standard_normal((n_train + n_val, out_size))
    x, y = x.astype(np.float32), y.astype(np.float32)
    return ArrayDataset(x=x[:n_train], y=y[:n_train]), ArrayDataset(x=x[n_train:], y=y[n_train:])


def damped_oscillator_step(
    state: np.ndarray, omega: float = 2.0, zeta: float = 0.1, dt: float = 0.1
) -> np.ndarray:
    """One semi-implicit Euler step of `x'' + 2ζωx' + ω²x = 0` on `[..., (position, velocity)]`."""
    state = np.asarray(state, dtype=np.float64)
    x, v = state[..., 0], state[..., 1]
    v_next = v + dt * (-2.0 * zeta * omega * v - omega**2 * x)
    x_next = x + dt * v_next
    return np.stack([x_next, v_next], axis=-1)


def oscillator_task(n_train: int = 256, n_val: int = 64, seed: int = 0) -> tuple[Any, Any]:
    """One-step emulation of the damped oscillator: `x` = state, `y` = next state."""
    from pipekit_train.core.data import ArrayDataset

    rng = np.random.default_rng(seed + 1)
    states = rng.uniform(-1.0, 1.0, size=(n_train + n_val, 2))
    nxt = damped_oscillator_step(states)
    x, y = states.astype(np.float32), nxt.astype(np.float32)
    return ArrayDataset(x=x[:n_train], y=y[:n_train]), ArrayDataset(x=x[n_train:], y=y[n_train:])


def flow_task(n_train: int = 256, n_val: int = 64, seed: int = 0) -> tuple[Any, Any]:
    """A conditional density for the flow head: `x` (4 values) → `y` (2 correlated values).

    `y_1 = x @ w_1 + 0.3 ε_1`, `y_2 = 0.5 y_1² - 0.5 + x @ w_2 + 0.2 ε_2` (a curved, noisy
    target, so the flow's NLL has something to learn), float32.
    """
    from pipekit_train.core.data import ArrayDataset

    rng = np.random.default_rng(seed + 2)
    w = 0.5 * rng.standard_normal((4, 2))
    x = rng.standard_normal((n_train + n_val, 4))
    eps = rng.standard_normal((n_train + n_val, 2))
    y1 = x @ w[:, 0] + 0.3 * eps[:, 0]
    y2 = 0.5 * y1**2 - 0.5 + x @ w[:, 1] + 0.2 * eps[:, 1]
    y = np.stack([y1, y2], axis=-1)
    x, y = x.astype(np.float32), y.astype(np.float32)
    return ArrayDataset(x=x[:n_train], y=y[:n_train]), ArrayDataset(x=x[n_train:], y=y[n_train:])


#: The conformance tasks by name: `TASKS[name]()` returns `(train, validation)`.
TASKS: dict[str, Callable[[], tuple[Any, Any]]] = {
    "regression": regression_task,
    "oscillator": oscillator_task,
    "flow": flow_task,
}


def task_loss(task: str) -> Any:
    """The loss the conformance suite trains `task` with (`flow_nll` for `"flow"`)."""
    from pipekit_train.core import losses

    return losses.flow_nll(**FLOW_HEAD) if task == "flow" else losses.mse
