"""The Lorenz-96 simulator shipped with the examples: deterministic, chaotic, usable as data."""

from __future__ import annotations

import functools

import lorenz96
import numpy as np
import pytest

from pipekit_train.core.data import (
    SimulationDataset,
    Trajectories,
    TrajectoryWindows,
    make_batches,
)


def test_trajectories_are_deterministic_given_the_seed() -> None:
    a = lorenz96.trajectories(3, n_steps=20, seed=7)
    assert a.shape == (3, 21, 20) and a.dtype == np.float32
    assert a.tobytes() == lorenz96.trajectories(3, n_steps=20, seed=7).tobytes()
    assert not np.array_equal(a, lorenz96.trajectories(3, n_steps=20, seed=8))
    # one emulator step is INNER Runge-Kutta steps of DT
    x = a[:, 4].astype(np.float64)
    np.testing.assert_allclose(lorenz96.advance(x), a[:, 5], rtol=1e-5, atol=1e-5)
    assert lorenz96.EMULATOR_DT == pytest.approx(0.05)


def test_nearby_initial_states_separate_at_the_chaotic_rate() -> None:
    x0 = lorenz96.sample_initial_state(np.random.default_rng(0))
    nudged = x0 + 1e-8 * np.random.default_rng(1).normal(size=x0.shape)
    both = lorenz96.simulate(np.stack([x0, nudged]), n_steps=400, dtype=np.float64)
    assert both.shape == (2, 401, 20)
    distance = np.linalg.norm(both[0] - both[1], axis=-1)
    # grows from 1e-8 to the size of the attractor (a std of about 3.6 per variable)
    assert distance[0] < 1e-7 and distance[-1] > 1.0
    # the exponential rate of the growth over 1 to 10 time units (20 to 200 steps), about
    # the largest Lyapunov exponent (1.55 per time unit)
    rate = np.log(distance[200] / distance[20]) / (180 * lorenz96.EMULATOR_DT)
    assert 0.8 < rate < 2.5, rate
    # the states stay on the attractor: bounded, mean near 2.3 for F = 8
    assert np.abs(both).max() < 20 and 1.5 < both.mean() < 3.5


def test_the_simulator_feeds_the_trajectory_datasets() -> None:
    sims = SimulationDataset(
        functools.partial(lorenz96.simulate, n_steps=12),
        lorenz96.sample_initial_state,
        n=4,
        seed=3,
        param_key="x0",
    )
    trajs = Trajectories.from_dataset(sims)
    assert (len(trajs), trajs.length, trajs.state_shape) == (4, 13, (20,))
    windows = TrajectoryWindows(trajs, k=4, stride=2, targets="increments")
    batch = next(make_batches(windows, 8, seed=0))
    assert batch["x"].shape == (8, 20) and batch["y"].shape == (8, 4, 20)
    arrays = TrajectoryWindows(lorenz96.trajectories(5, n_steps=40, seed=0), k=1)
    norm = arrays.normalizer()
    assert norm.mean["x"].shape == (20,) and np.all(norm.std["x"] > 1.0)
