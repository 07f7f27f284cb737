"""`TrainingArtifact.rollout` and `evaluate(..., rollout=...)` without a backend: the
numpy reference's emulator rolled out with `NeuralForward`, and bad input refused."""

from __future__ import annotations

import numpy as np
import pytest

from pipekit_train.core import (
    ArrayDataset,
    ConfigError,
    NeuralForward,
    TrainingLoop,
    rollout_validation,
)
from pipekit_train.core.data import Trajectories, TrajectoryWindows
from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp


@pytest.fixture(scope="module")
def trained():
    rng = np.random.default_rng(0)
    states = np.cumsum(rng.normal(size=(6, 30, 3)) * 0.1, axis=1).astype(np.float32)
    pairs = TrajectoryWindows(states[:4], k=1)  # one-step training on states
    artifact = TrainingLoop(
        NumpyLinearOp("pipekit_train.core.testing:linear", in_size=3, out_size=3),
        pairs,
        adapter=NumpyAdapter(),
        batch_size=16,
        max_steps=5,
        progress=False,
    ).run()
    return artifact, Trajectories(states[4:])


def test_the_rollout_of_an_artifact_is_neural_forward_rolled_out(trained) -> None:
    artifact, held_out = trained
    report = artifact.rollout(held_out, 8, residual=False, dt=0.5)
    want = rollout_validation(
        NeuralForward(artifact.model, residual=False), held_out, 8, prefix="rollout_", dt=0.5
    )
    assert report.metrics == pytest.approx(want.metrics, rel=1e-6)
    assert report.horizon == 8 and report.dt == 0.5
    # windows carry their step and targets; the default horizon is the whole trajectories
    windows = TrajectoryWindows(held_out, k=1, step=2)
    assert artifact.rollout(windows).horizon == (held_out.length - 1) // 2
    out = artifact.evaluate(windows, rollout={"horizon": 4, "prefix": "held_out_"})
    assert {"loss", "held_out_nrmse", "held_out_vrmse_lead_1_4"} <= set(out)


def test_bad_rollout_requests_are_refused(trained) -> None:
    artifact, held_out = trained
    with pytest.raises(ConfigError, match=r"Pass residual=True or residual=False"):
        artifact.rollout(held_out, 4)  # a one-step run's plan does not say
    with pytest.raises(ConfigError, match=r"`trajectories` must be held-out `Trajectories`"):
        artifact.rollout(ArrayDataset(x=np.zeros((4, 3)), y=np.zeros((4, 3))), 4, residual=False)
    with pytest.raises(ConfigError, match=r"`rollout` must be True, False or a dict"):
        artifact.evaluate(TrajectoryWindows(held_out, k=1), rollout=4)
    with pytest.raises(ConfigError, match=r"horizon=40 steps.*T=30"):
        artifact.rollout(held_out, 40, residual=False)


def test_rollout_validation_with_a_step_compares_the_right_states() -> None:
    # s[t+1] = A s[t]: the exact emulator of two stored steps is A @ A
    a = np.array([[0.99, -0.1], [0.1, 0.99]])
    states = np.empty((2, 21, 2))
    states[:, 0] = [[1.0, 0.0], [0.0, 1.0]]
    for t in range(20):
        states[:, t + 1] = states[:, t] @ a.T
    exact = rollout_validation(lambda s: s @ (a @ a).T, states, 10, step=2)
    assert exact.metrics["val_rollout_nrmse"] < 1e-12
    one = rollout_validation(lambda s: s @ a.T, states, 10, step=2)  # the wrong step
    assert one.metrics["val_rollout_nrmse"] > 0.05
