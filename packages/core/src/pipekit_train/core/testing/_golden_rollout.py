"""The golden-run suite's rollout cases: training through the rollout, the same everywhere.

Every backend builds its MLP from the same canonical weights (`golden_weights`) and
trains it as a residual emulator of a damped pendulum (`golden_rollout_task`: windows
of 4 steps over a few trajectories, with the windows' normalizer) through
`TrainingLoop(rollout=...)`: k = 4 with full backpropagation, k = 4 with pushforward
(`backprop="last"`), and a curriculum `{0: 1, 2: 2, 4: 4}` with input noise (the
noise comes from core's feed, so every backend adds the same). Two more cases give the
model more than its state (`ModelInputs`): a driven pendulum whose damping is a static
input and whose torque a forcing, seen with a history of 2 states, trained one step at
a time and through a rollout of 4 (`golden_forced_task`). Two put a solver in the
loop, given once with the array API so every backend calls it on its own arrays: the
diverted chain against an RK4 step of the pendulum (`diverted_k4`, `pendulum_rk4`) and
a model that corrects a semi-implicit Euler step (`correction_k4`, `pendulum_euler`,
`correction="parallel"`). One trains a generative emulator as an ensemble
(`ensemble_crps_k4`: 4 members per sample, each with 2 noise channels drawn by core's
feed, rolled out 4 steps and scored by the fair CRPS). The suite records every step's loss and the final validation
loss (the longest rollout); `compare_golden` checks two backends' runs.

```python
from pipekit_train.core.testing import GOLDEN_ROLLOUT_CASES, compare_golden, run_golden_rollout
from pipekit_train.equinox.testing import golden_backend as equinox_backend
from pipekit_train.lightning.testing import golden_backend as lightning_backend

reference = run_golden_rollout(equinox_backend())
other = run_golden_rollout(lightning_backend())
assert not compare_golden(reference, other, GOLDEN_ROLLOUT_CASES)
```
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import array_api_compat
import numpy as np

from pipekit_train.core import Rollout, TrainingLoop, losses
from pipekit_train.core.data import Trajectories, TrajectoryWindows

from ._golden import GoldenBackend, GoldenCase, GoldenRun, golden_weights

__all__ = [
    "GOLDEN_ROLLOUTS",
    "GOLDEN_ROLLOUT_CASES",
    "GOLDEN_ROLLOUT_STEPS",
    "golden_forced_task",
    "golden_rollout_task",
    "pendulum_euler",
    "pendulum_rk4",
    "periodic_diffusion",
    "rollout_case_loop",
    "run_golden_rollout",
]

PENDULUM_DT = 0.2
"""The time step of the golden pendulum's trajectories and of its steppers."""


def _pendulum_field(xp: Any, s: Any) -> Any:
    theta, omega = s[..., 0:1], s[..., 1:2]
    return xp.concat([omega, -xp.sin(theta) - 0.1 * omega], axis=-1)


def pendulum_rk4(state: Any) -> Any:
    """One RK4 step (`dt = 0.2`) of the golden damped pendulum, `theta'' = -sin(theta) -
    0.1 theta'`, on a batch of states `(B, 2)` of any array-API library: the reference
    stepper of `diverted_k4` (the trajectories' own scheme)."""
    xp = array_api_compat.array_namespace(state)
    dt = PENDULUM_DT
    a = _pendulum_field(xp, state)
    b = _pendulum_field(xp, state + (0.5 * dt) * a)
    c = _pendulum_field(xp, state + (0.5 * dt) * b)
    d = _pendulum_field(xp, state + dt * c)
    return state + (dt / 6.0) * (a + 2.0 * b + 2.0 * c + d)


def periodic_diffusion(state: Any) -> Any:
    """One explicit step of diffusion on a periodic grid along the last axis, `u + 0.1
    (u[j+1] - 2 u[j] + u[j-1])`, on a batch of any array-API library (slices and
    `concat`, no `roll`): a cheap linear stepper for tests of vector states."""
    xp = array_api_compat.array_namespace(state)
    left = xp.concat([state[..., -1:], state[..., :-1]], axis=-1)
    right = xp.concat([state[..., 1:], state[..., :1]], axis=-1)
    return state + 0.1 * (left - 2.0 * state + right)


def pendulum_euler(state: Any) -> Any:
    """One semi-implicit Euler step (`dt = 0.2`) of the golden damped pendulum on a batch
    of states `(B, 2)` of any array-API library: the coarse stepper of `correction_k4`."""
    xp = array_api_compat.array_namespace(state)
    dt = PENDULUM_DT
    theta, omega = state[..., 0:1], state[..., 1:2]
    omega = omega + dt * (-xp.sin(theta) - 0.1 * omega)
    return xp.concat([theta + dt * omega, omega], axis=-1)


GOLDEN_ROLLOUT_STEPS = 12
"""Optimizer steps per rollout case."""

GOLDEN_ROLLOUT_CASES: tuple[GoldenCase, ...] = (
    GoldenCase("rollout_k4_full", {"name": "adam", "lr": 0.01}),
    GoldenCase("rollout_k4_pushforward", {"name": "adam", "lr": 0.01}),
    GoldenCase("rollout_schedule_noise", {"name": "adam", "lr": 0.01, "clip_norm": 1.0}),
    GoldenCase("forced_history2_one_step", {"name": "adam", "lr": 0.01}),
    GoldenCase("forced_history2_rollout_k4", {"name": "adam", "lr": 0.01}),
    GoldenCase("diverted_k4", {"name": "adam", "lr": 0.01}),
    GoldenCase("correction_k4", {"name": "adam", "lr": 0.01}),
    GoldenCase("ensemble_crps_k4", {"name": "adam", "lr": 0.01}),
)
"""The rollout cases (their `Rollout` specs: `GOLDEN_ROLLOUTS`)."""

GOLDEN_ROLLOUTS: Mapping[str, Rollout | None] = {
    "rollout_k4_full": Rollout(steps=4, weights=(1.0, 1.0, 0.5, 0.5), residual=True),
    "rollout_k4_pushforward": Rollout(steps=4, backprop="last", residual=True),
    "rollout_schedule_noise": Rollout(
        steps=4, schedule={0: 1, 2: 2, 4: 4}, noise_std=0.05, backprop=2, residual=True
    ),
    "forced_history2_one_step": None,
    "forced_history2_rollout_k4": Rollout(steps=4, noise_std=0.05, residual=True),
    "diverted_k4": Rollout(
        steps=4, residual=True, target="diverted", ref_stepper=pendulum_rk4, noise_std=0.05
    ),
    "correction_k4": Rollout(
        steps=4, residual=True, coarse_stepper=pendulum_euler, correction="parallel"
    ),
    "ensemble_crps_k4": Rollout(steps=4, residual=True, backprop=2),
}
"""The `Rollout` of each case in `GOLDEN_ROLLOUT_CASES`, by name."""

_SIZES = (2, 16, 2)  # the MLP: a pendulum state (angle, velocity) in and its increment out
# the forced cases' MLP: two states, the torque and the damping in; the increment out
_FORCED_SIZES = (6, 16, 2)
# the ensemble case's MLP: the state and 2 noise channels in, the increment out
_ENSEMBLE_SIZES = (4, 16, 2)
_LOSSES: Mapping[str, Any] = {"ensemble_crps_k4": losses.crps(members=4, noise_dim=2)}


def golden_rollout_task(
    n_train: int = 6, n_val: int = 2, length: int = 24, k: int = 4, seed: int = 0
) -> tuple[TrajectoryWindows, TrajectoryWindows]:
    """`(train, validation)` windows of `k` steps over damped-pendulum trajectories.

    `theta'' = -sin(theta) - 0.1 theta'`, stepped with RK4 at `dt = 0.2` from random
    starts, float32 states `(angle, velocity)`; residual targets (`"increments"`). The
    training and validation windows come from different trajectories.
    """
    rng = np.random.default_rng(seed)
    n = n_train + n_val
    state = np.stack([rng.uniform(-2.0, 2.0, n), rng.uniform(-1.0, 1.0, n)], axis=1)

    def field(s: np.ndarray) -> np.ndarray:
        return np.stack([s[:, 1], -np.sin(s[:, 0]) - 0.1 * s[:, 1]], axis=1)

    dt, states = 0.2, [state]
    for _ in range(length - 1):
        a = field(state)
        b = field(state + 0.5 * dt * a)
        c = field(state + 0.5 * dt * b)
        d = field(state + dt * c)
        state = state + dt / 6.0 * (a + 2 * b + 2 * c + d)
        states.append(state)
    traj = np.stack(states, axis=1).astype(np.float32)  # (n, length, 2)
    return (
        TrajectoryWindows(traj[:n_train], k=k, targets="increments"),
        TrajectoryWindows(traj[n_train:], k=k, targets="increments"),
    )


def golden_forced_task(
    n_train: int = 6, n_val: int = 2, length: int = 24, k: int = 4, seed: int = 0
) -> tuple[TrajectoryWindows, TrajectoryWindows]:
    """`(train, validation)` windows over driven, damped pendulums, with history 2.

    `theta'' = -sin(theta) - c theta' + tau(t)`: the damping `c` is a static input (one
    per trajectory), the torque `tau(t) = a sin(w t + phi)` a forcing (held at its value
    at the start of each RK4 step of `dt = 0.2`). Float32 states `(angle, velocity)`,
    residual targets; the model sees the last two states, the torque and the damping.
    """
    rng = np.random.default_rng(seed)
    n = n_train + n_val
    state = np.stack([rng.uniform(-2.0, 2.0, n), rng.uniform(-1.0, 1.0, n)], axis=1)
    damping = rng.uniform(0.05, 0.5, n)
    amp, omega, phase = rng.uniform(0.2, 1.0, n), rng.uniform(0.5, 1.5, n), rng.uniform(0, 6, n)
    dt = 0.2
    torque = amp[:, None] * np.sin(omega[:, None] * dt * np.arange(length) + phase[:, None])

    def field(s: np.ndarray, tau: np.ndarray) -> np.ndarray:
        return np.stack([s[:, 1], -np.sin(s[:, 0]) - damping * s[:, 1] + tau], axis=1)

    states = [state]
    for t in range(length - 1):
        tau = torque[:, t]
        a = field(state, tau)
        b = field(state + 0.5 * dt * a, tau)
        c = field(state + 0.5 * dt * b, tau)
        d = field(state + dt * c, tau)
        state = state + dt / 6.0 * (a + 2 * b + 2 * c + d)
        states.append(state)
    traj = np.stack(states, axis=1).astype(np.float32)  # (n, length, 2)
    static = {"damping": damping[:, None].astype(np.float32)}
    forcings = {"torque": torque[:, :, None].astype(np.float32)}

    def windows(part: slice) -> TrajectoryWindows:
        trajs = Trajectories(
            traj[part],
            static={key: v[part] for key, v in static.items()},
            forcings={key: v[part] for key, v in forcings.items()},
        )
        return TrajectoryWindows(trajs, k=k, targets="increments", history=2)

    return windows(slice(0, n_train)), windows(slice(n_train, n))


def rollout_case_loop(
    backend: GoldenBackend, case: GoldenCase, *, steps: int = GOLDEN_ROLLOUT_STEPS, **overrides: Any
) -> TrainingLoop:
    """The `TrainingLoop` of one rollout case (`overrides` replace its keyword arguments)."""
    forced = case.name.startswith("forced_")
    train, val = (
        golden_forced_task(k=1 if case.name.endswith("one_step") else 4)
        if forced
        else golden_rollout_task()
    )
    sizes = _FORCED_SIZES if forced else _ENSEMBLE_SIZES if case.name in _LOSSES else _SIZES
    kwargs: dict[str, Any] = {
        "model": backend.model_from_weights(golden_weights(sizes)),
        "data": train,
        "validation": val,
        "rollout": GOLDEN_ROLLOUTS[case.name],
        "normalizer": train.normalizer(),
        "loss": _LOSSES.get(case.name, "mse"),
        "optimizer_config": dict(case.optimizer_config),
        "batch_size": 16,
        "max_steps": steps,
        "accumulate_grad_batches": case.accumulate_grad_batches,
        "validate_every_n_steps": steps,
        "log_every_n_steps": steps,
        "seed": 0,
        "adapter": backend.adapter(case.precision),
        "progress": False,
    }
    kwargs.update(overrides)
    return TrainingLoop(**kwargs)


def run_golden_rollout(
    backend: GoldenBackend,
    cases: Iterable[GoldenCase] = GOLDEN_ROLLOUT_CASES,
    *,
    steps: int = GOLDEN_ROLLOUT_STEPS,
) -> dict[str, GoldenRun]:
    """Train every rollout case on `backend`; return the runs by case (`compare_golden`)."""
    runs: dict[str, GoldenRun] = {}
    for case in cases:
        artifact = rollout_case_loop(backend, case, steps=steps).run()
        runs[case.name] = GoldenRun(
            case=case.name,
            backend=backend.name,
            losses=[float(v) for v in artifact.history["loss"]],
            val_loss=float(artifact.final_metrics["val_loss"]),
        )
    return runs
