"""Shared toy tasks of the conformance suite: linear regression and a damped oscillator."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["damped_oscillator_step", "oscillator_task", "regression_task"]


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
