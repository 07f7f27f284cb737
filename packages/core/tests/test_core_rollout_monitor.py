"""`RolloutMonitor`: rollout errors at every validation, monitored by best-k checkpoints and
EarlyStopping, equal to `rollout_validation` of the trained model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipekit_train.core import (
    Checkpoint,
    ConfigError,
    EarlyStopping,
    NeuralForward,
    RolloutMonitor,
    TrainingLoop,
    rollout_validation,
)
from pipekit_train.core.checkpoint import step_dirs
from pipekit_train.core.testing import (
    NumpyAdapter,
    NumpyLinearOp,
    damped_oscillator_step,
    oscillator_task,
)

HORIZON = 30


def _held_out(n: int = 6, length: int = HORIZON + 1, seed: int = 5) -> np.ndarray:
    """Trajectories `(n, length, 2)` of the damped oscillator from random states."""
    states = [np.random.default_rng(seed).uniform(-1.0, 1.0, size=(n, 2))]
    for _ in range(length - 1):
        states.append(damped_oscillator_step(states[-1]))
    return np.stack(states, axis=1).astype(np.float32)


def _loop(tmp_path: Path, callbacks: list[Any], **kwargs: Any) -> TrainingLoop:
    train, val = oscillator_task(n_train=128, n_val=32)
    options: dict[str, Any] = {
        "validation": val,
        "adapter": NumpyAdapter(gradient_noise=0.05),
        "optimizer_config": {"name": "sgd", "lr": 0.3},
        "max_steps": 60,
        "validate_every_n_steps": 10,
        "checkpoint": Checkpoint(
            tmp_path / "ckpt",
            every_n_steps=10,
            max_to_keep=1,
            keep_best=1,
            monitor="val_rollout_nrmse_lead_11_30",
            async_save=False,
        ),
        **kwargs,
    }
    return TrainingLoop(
        model=NumpyLinearOp("pipekit_train.core.testing:linear", in_size=2, out_size=2),
        data=train,
        loss="mse",
        batch_size=16,
        callbacks=callbacks,
        progress=False,
        **options,
    )


def test_rollout_errors_are_validation_metrics_and_pick_the_kept_best_checkpoint(
    tmp_path: Path,
) -> None:
    trajectories = _held_out()
    monitor = RolloutMonitor(trajectories, HORIZON, bounds=(1, 10, 30))
    artifact = _loop(tmp_path, [monitor]).run()
    key = "val_rollout_nrmse_lead_11_30"
    steps, values = artifact.history.series(key)
    assert steps == [10, 20, 30, 40, 50, 60]
    assert "val_loss" in artifact.history.names  # the one-step validation is still there
    # the last value is the rollout of the trained model, as a user would compute it
    report = rollout_validation(
        NeuralForward(artifact.model), trajectories, HORIZON, bounds=(1, 10, 30)
    )
    assert values[-1] == pytest.approx(report.metrics[key], rel=1e-6)
    assert monitor.last_report is not None
    assert monitor.last_report.metrics[key] == pytest.approx(report.metrics[key], rel=1e-6)
    # the emulator beats persistence, which the monitor measured before training
    assert values[-1] < monitor.persistence.metrics[key]
    # best-k by the rollout error: the latest checkpoint and the best one are kept
    best = steps[int(np.argmin(values))]
    assert best != 60  # noisy gradients: the rollout error is not best at the end
    assert set(step_dirs(tmp_path / "ckpt")) == {60, best}


def test_early_stopping_watches_a_rollout_error(tmp_path: Path) -> None:
    monitor = RolloutMonitor(_held_out(), HORIZON, bounds=(1, 10, 30))
    # no improvement of 1e9 is ever seen: the second validation stops the run
    stopper = EarlyStopping(monitor="val_rollout_vrmse_lead_2_10", patience=0, min_delta=1e9)
    artifact = _loop(tmp_path, [monitor, stopper]).run()
    assert artifact.steps == 20
    assert stopper.stopped_step == 20 and stopper.best_step == 10


def test_bad_rollout_settings_are_refused_before_training(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="horizon"):
        RolloutMonitor(_held_out(length=10), HORIZON)  # the trajectories are too short
    with pytest.raises(ConfigError, match="residual"):
        RolloutMonitor(_held_out(), HORIZON, residual="yes")  # type: ignore[arg-type]
    monitor = RolloutMonitor(_held_out(), HORIZON)
    with pytest.raises(ConfigError, match="validation=None"):
        _loop(tmp_path, [monitor], validation=None, validate_every_n_steps=None).run()
    assert not (tmp_path / "ckpt").exists() or step_dirs(tmp_path / "ckpt") == []
