"""`rollout_validation`: held-out trajectories rolled out and scored per lead and field."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipekit_train.core import (
    ConfigError,
    NeuralForward,
    TrainingLoop,
    Trajectories,
    TrajectoryWindows,
    rollout_validation,
)
from pipekit_train.core.data import fit_trajectory_normalizer
from pipekit_train.core.testing import NumpyLinearOp

ANGLE = 0.1


def _rotate(x: np.ndarray, angle: float = ANGLE) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.stack([c * x[..., 0] - s * x[..., 1], s * x[..., 0] + c * x[..., 1]], axis=-1)


def _circles(n: int = 4, t: int = 60) -> np.ndarray:
    """Trajectories of a rotation: `(n, t, 2)`."""
    x = np.random.default_rng(0).normal(size=(n, 2))
    out = [x]
    for _ in range(t - 1):
        out.append(_rotate(out[-1]))
    return np.stack(out, axis=1)


def test_the_true_operator_scores_zero_and_a_wrong_one_grows() -> None:
    trajs = _circles()
    exact = rollout_validation(_rotate, trajs, 40, starts=(0, 10, 19))
    assert exact.errors["nrmse"].shape == (40, 1) and exact.channels == ["state"]
    np.testing.assert_allclose(exact.errors["nrmse"], 0.0, atol=1e-12)
    assert set(exact.metrics) == {
        "val_rollout_nrmse",
        "val_rollout_nrmse_lead_1_10",
        "val_rollout_nrmse_lead_11_30",
        "val_rollout_nrmse_lead_31_40",
        "val_rollout_vrmse",
        "val_rollout_vrmse_lead_1_10",
        "val_rollout_vrmse_lead_11_30",
        "val_rollout_vrmse_lead_31_40",
    }
    assert exact.predictions.shape == (4 * 3, 40, 2)
    slow = rollout_validation(lambda x: _rotate(x, 0.9 * ANGLE), trajs, 40)
    per_lead = slow.errors["nrmse"][:, 0]
    assert np.all(np.diff(per_lead) > 0)  # the phase error grows every step
    # |e_h| = 2 sin(h * 0.01 / 2) |x| for a rotation lagging by 0.01 per step
    np.testing.assert_allclose(per_lead, 2 * np.sin(np.arange(1, 41) * 0.01 / 2), rtol=1e-5)
    m = slow.metrics
    assert m["val_rollout_nrmse_lead_1_10"] < m["val_rollout_nrmse_lead_11_30"]
    assert slow.valid_prediction_time(0.2) == float(np.sum(per_lead <= 0.2))


def test_a_neural_forward_on_a_grid_is_scored_per_field(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    states = rng.normal(size=(3, 30, 16, 2)).cumsum(axis=1) * [1.0, 5.0]
    norm = fit_trajectory_normalizer(Trajectories(states), residual=True)

    def zero_increment(batch: np.ndarray) -> np.ndarray:
        return np.zeros_like(batch)

    persistence = NeuralForward(zero_increment, None, residual=True, state_ndim=2)
    report = rollout_validation(
        persistence, states, 25, spatial_ndim=1, channels=["u", "v"], prefix="val_", dt=0.5
    )
    assert report.errors["nrmse"].shape == (25, 2)
    assert report.errors["spectral"].shape == (25, 3, 2)
    persisted = np.broadcast_to(states[:, :1], (3, 25, 16, 2))
    want = np.sqrt(
        ((persisted - states[:, 1:26]) ** 2).mean(axis=2)
        / ((states[:, 1:26] ** 2).mean(axis=2) + 1e-7)
    ).mean(axis=0)
    np.testing.assert_allclose(report.errors["nrmse"], want, rtol=1e-9)
    assert {"val_nrmse_u_lead_1_10", "val_vrmse_v", "val_spectral_bin0_lead_11_25"} <= set(
        report.metrics
    )
    with_norm = NeuralForward(zero_increment, norm, residual=True, state_ndim=2)
    shifted = rollout_validation(with_norm, states, 5, spatial_ndim=1)
    assert shifted.metrics["val_rollout_nrmse"] != report.metrics["val_nrmse"]
    fig = report.figure(tmp_path / "lead.png")
    assert (tmp_path / "lead.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert fig.axes[0].get_xlabel() == "lead (time)"
    assert len(fig.axes[0].get_lines()) >= 3  # u, v and their mean


def test_valid_prediction_time_per_rollout() -> None:
    growth = np.array([[1.0], [1.05]])  # rollout 0 exact, rollout 1 grows 5% a step

    def forward(x: np.ndarray) -> np.ndarray:
        return _rotate(x) * growth

    report = rollout_validation(forward, _circles(2, 11), 10)
    # |error| / |x| = 1.05**h - 1 exceeds 0.2 first at lead 4 (0.2155)
    np.testing.assert_array_equal(report.valid_prediction_time(0.2, mean=False), [10.0, 3.0])
    assert report.valid_prediction_time(0.2) == 6.5
    with pytest.raises(ConfigError, match=r"metric='spectral'"):
        report.valid_prediction_time(0.2, "spectral")


def test_a_diverged_rollout_scores_inf() -> None:
    with np.errstate(over="ignore"):
        report = rollout_validation(lambda x: x * 1e200, _circles(2, 10), 5)
    assert np.isinf(report.errors["nrmse"][-1]).all()
    assert report.metrics["val_rollout_nrmse"] == np.inf
    assert report.valid_prediction_time(0.5) == 0.0


def test_bad_settings_are_refused_before_any_step() -> None:
    calls = []

    def forward(x: np.ndarray) -> np.ndarray:
        calls.append(1)
        return x

    trajs = _circles(2, 20)
    with pytest.raises(ConfigError, match=r"horizon=20.*T=20.*horizon <= 19"):
        rollout_validation(forward, trajs, 20)
    with pytest.raises(ConfigError, match=r"starts \[10\].*starts at 9 at the latest"):
        rollout_validation(forward, trajs, 10, starts=(0, 10))
    with pytest.raises(ConfigError, match=r"dt=0"):
        rollout_validation(forward, trajs, 5, dt=0)
    with pytest.raises(ConfigError, match=r"bounds="):
        rollout_validation(forward, trajs, 5, bounds=(3, 2))
    assert calls == []
    with pytest.raises(ConfigError, match=r"output shape \(2, 1\) at lead 1"):
        rollout_validation(lambda x: x[:, :1], trajs, 5)


def test_one_step_training_on_windows_then_rollout_validation() -> None:
    # a linear system: x_{t+1} = R x_t, so a linear model learns the increment exactly
    trajs = Trajectories(_circles(24, 40), static={"phase": np.zeros((24, 1), np.float32)})
    train, val = TrajectoryWindows(trajs, k=1, targets="increments").split((0.75, 0.25), seed=0)
    norm = train.normalizer()
    artifact = TrainingLoop(
        model=NumpyLinearOp("pipekit_train.core.testing:linear", in_size=3, out_size=2),
        data=train,
        validation=val,
        normalizer=norm,
        optimizer_config={"name": "adam", "lr": 0.02},
        batch_size=32,
        max_steps=400,
        progress=False,
    ).run()
    # the static phase reaches the model as a third input channel
    forward = NeuralForward(artifact.model, norm, residual=True, inputs=artifact.inputs)
    held_out = val.trajectories
    report = rollout_validation(forward, held_out, 30)
    persistence = rollout_validation(lambda x: x, held_out, 30)
    # measured: 2e-8 over leads 1-10 and 5e-8 over 11-30; persistence 1.27
    assert report.metrics["val_rollout_nrmse_lead_1_10"] < 1e-3
    assert report.metrics["val_rollout_nrmse_lead_11_30"] < 1e-3
    assert persistence.metrics["val_rollout_nrmse"] > 0.5
