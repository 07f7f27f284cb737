"""Ensemble rollout validation: `rollout_validation(..., members=M)` and
`RolloutMonitor(members=M)` roll each start out as `M` members drawn from a Gaussian head
and score them per lead (CRPS, spread–skill, rank histograms).

The system is stochastic and linear, `x' = A x + σ ε`, and the model its exact Gaussian
head, so the ensemble is calibrated against held-out trajectories of the same system;
a head with a quarter of the noise is not.
"""

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

SIGMA = 0.05
HORIZON = 12
A = 0.97 * np.array([[np.cos(0.2), -np.sin(0.2)], [np.sin(0.2), np.cos(0.2)]])


def _gaussian_head(noise: float = SIGMA):
    """The exact step as a Gaussian head: mean `A x`, log-variance `log noise²`."""

    def head(x: np.ndarray) -> np.ndarray:
        mean = np.asarray(x, np.float64) @ A.T
        return np.concatenate([mean, np.full_like(mean, 2 * np.log(noise))], axis=-1)

    return head


@pytest.fixture(scope="module")
def held_out() -> np.ndarray:
    """400 trajectories `(400, HORIZON + 1, 2)` of the stochastic system."""
    rng = np.random.default_rng(0)
    states = [rng.normal(size=(400, 2))]
    for _ in range(HORIZON):
        states.append(states[-1] @ A.T + SIGMA * rng.standard_normal((400, 2)))
    return np.stack(states, axis=1)


def test_a_calibrated_head_scores_spread_skill_one_and_a_narrow_one_does_not(
    held_out: np.ndarray,
) -> None:
    forward = NeuralForward(_gaussian_head(), head="gaussian")
    report = rollout_validation(forward, held_out, HORIZON, members=8, seed=3, bounds=(4,))
    m = report.metrics
    assert report.members == 8 and report.ensemble.shape == (400, HORIZON, 8, 2)
    np.testing.assert_allclose(report.predictions, report.ensemble.mean(axis=2))
    for window in ("lead_1_4", "lead_5_12"):
        assert m[f"val_rollout_spread_skill_{window}"] == pytest.approx(1.0, abs=0.1)
    assert report.ensemble_errors["rank_histogram"].shape == (HORIZON, 9)
    assert m["val_rollout_rank_flatness"] < 4.0
    narrow = rollout_validation(
        NeuralForward(_gaussian_head(SIGMA / 4), head="gaussian"),
        held_out,
        HORIZON,
        members=8,
        seed=3,
        bounds=(4,),
    )
    n = narrow.metrics
    assert n["val_rollout_spread_skill"] < 0.5
    assert n["val_rollout_rank_flatness"] > 10 * m["val_rollout_rank_flatness"]
    assert n["val_rollout_crps"] > m["val_rollout_crps"]
    # the mean's errors are those of the ensemble mean, next to the ensemble scores
    assert {"val_rollout_nrmse_lead_1_4", "val_rollout_ens_rmse_lead_5_12"} <= set(m)
    # the seed fixes the draws
    again = rollout_validation(forward, held_out, HORIZON, members=8, seed=3, bounds=(4,))
    assert again.metrics == m
    other = rollout_validation(forward, held_out, HORIZON, members=8, seed=4, bounds=(4,))
    assert other.metrics["val_rollout_crps"] != m["val_rollout_crps"]


def test_a_diverging_member_scores_inf_from_its_lead(held_out: np.ndarray) -> None:
    def exploding(x: np.ndarray) -> np.ndarray:  # the mean grows 1e80 times a step
        mean = np.asarray(x, np.float64) * 1e80
        return np.concatenate([mean, np.zeros_like(mean)], axis=-1)

    with np.errstate(all="ignore"):
        report = rollout_validation(
            NeuralForward(exploding, head="gaussian"), held_out[:3], HORIZON, members=2
        )
    crps = report.ensemble_errors["crps"][:, 0]
    # lead 4 overflows (1e320): the leads before it are rolled out again with the seed
    assert np.isfinite(report.ensemble[:, :3]).all() and np.isnan(report.ensemble[:, 3:]).all()
    assert np.isfinite(crps[:3]).all() and np.isinf(crps[3:]).all()
    assert report.metrics["val_rollout_crps"] == np.inf
    assert np.isinf(report.errors["nrmse"][-1]).all()


def test_ensemble_figure_draws_spread_skill_and_rank_histograms(
    held_out: np.ndarray, tmp_path: Path
) -> None:
    forward = NeuralForward(_gaussian_head(), head="gaussian")
    report = rollout_validation(forward, held_out[:20], HORIZON, members=4)
    fig = report.ensemble_figure(tmp_path / "ens.png", leads=(1, 6))
    assert (tmp_path / "ens.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    left, right = fig.axes
    assert len(left.get_lines()) >= 2 and left.get_xlabel() == "lead (emulator steps)"
    assert [t.get_text() for t in right.get_legend().get_texts()] == ["lead 1", "lead 6", "flat"]
    with pytest.raises(ConfigError, match=r"leads=\(0,\)"):
        report.ensemble_figure(leads=(0,))
    deterministic = rollout_validation(forward, held_out[:20], HORIZON)
    assert deterministic.members is None and "val_rollout_crps" not in deterministic.metrics
    with pytest.raises(ConfigError, match="members=None"):
        deterministic.ensemble_figure()


def test_members_are_refused_where_no_ensemble_can_be_drawn(held_out: np.ndarray) -> None:
    forward = NeuralForward(_gaussian_head(), head="gaussian")
    for bad in (1, 0, True, 2.0, "4"):
        with pytest.raises(ConfigError, match=r"int >= 2.*members="):
            rollout_validation(forward, held_out, HORIZON, members=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="seed=-1"):
        rollout_validation(forward, held_out, HORIZON, members=4, seed=-1)
    with pytest.raises(ConfigError, match="needs a NeuralForward"):
        rollout_validation(lambda x: x, held_out, HORIZON, members=4)
    point = NeuralForward(lambda x: np.asarray(x) @ A.T)
    with pytest.raises(ConfigError, match="head='point'"):
        rollout_validation(point, held_out, HORIZON, members=4)
    with pytest.raises(ConfigError, match="members=1"):
        RolloutMonitor(held_out, HORIZON, members=1)
    with pytest.raises(ConfigError, match="seed='a'"):
        RolloutMonitor(held_out, HORIZON, members=4, seed="a")  # type: ignore[arg-type]


class FakeState:
    """What `RolloutMonitor` reads of a run: plan, normalizer and predict."""

    def __init__(self, loss: Any = None) -> None:
        self.plan = {"loss": loss or {"name": "gaussian_nll"}, "validation": {"n": 1}}
        self.normalizer = None
        self.head = _gaussian_head()

    def predict(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        return self.head(batch["x"])


def test_monitor_scores_the_ensemble_the_same_at_every_validation(held_out: np.ndarray) -> None:
    monitor = RolloutMonitor(held_out[:50], HORIZON, members=6, seed=2, bounds=(4,))
    state = FakeState()
    monitor.on_train_start(state)
    first = dict(monitor.validation_metrics(state))
    second = dict(monitor.validation_metrics(state))
    assert first == second  # the same weights, the same draws
    assert {"val_rollout_crps", "val_rollout_crps_lead_1_4", "val_rollout_spread_skill"} <= set(
        first
    )
    assert all(np.isfinite(v) for v in first.values())
    report = rollout_validation(
        NeuralForward(_gaussian_head(), head="gaussian"),
        held_out[:50],
        HORIZON,
        members=6,
        seed=2,
        bounds=(4,),
    )
    assert first == pytest.approx(report.metrics, rel=1e-6)  # the model's float32 input
    assert "members=6, seed=2" in repr(monitor)
    with pytest.raises(ConfigError, match=r"point head.*members=6"):
        monitor.on_train_start(FakeState(loss={"name": "mse"}))


class _ReadAsGaussian:
    """A run state whose loss reads as `gaussian_nll`: the numpy reference adapter trains
    only `mse`, so the test model learns the Gaussian head's layout (mean, log-variance)
    by regression instead, and its evaluator takes targets of that width."""

    def __init__(self, state: Any) -> None:
        self._state = state
        self.plan = {**state.plan, "loss": {"name": "gaussian_nll"}}

    def predict(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        y = np.concatenate([batch["y"], batch["y"]], axis=-1)
        return self._state.predict({**batch, "y": y})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)


class _GaussianMonitor(RolloutMonitor):
    def on_train_start(self, state: Any) -> None:
        super().on_train_start(_ReadAsGaussian(state))

    def validation_metrics(self, state: Any) -> Any:
        return super().validation_metrics(_ReadAsGaussian(state))


def _oscillator(n: int = 6, length: int = HORIZON + 1) -> np.ndarray:
    states = [np.random.default_rng(5).uniform(-1.0, 1.0, size=(n, 2))]
    for _ in range(length - 1):
        states.append(damped_oscillator_step(states[-1]))
    return np.stack(states, axis=1).astype(np.float32)


def _run(tmp_path: Path, monitor: RolloutMonitor, **kwargs: Any) -> Any:
    train, val = oscillator_task(n_train=128, n_val=32)
    if kwargs.pop("gaussian", True):  # targets (next state, log-variance log 0.01²)
        train, val = (
            type(d)(
                x=d.arrays["x"],
                y=np.concatenate(
                    [d.arrays["y"], np.full_like(d.arrays["y"], 2 * np.log(0.01))], axis=1
                ),
            )
            for d in (train, val)
        )
    return TrainingLoop(
        model=NumpyLinearOp(
            "pipekit_train.core.testing:linear",
            in_size=2,
            out_size=train.arrays["y"].shape[1],
        ),
        data=train,
        validation=val,
        loss="mse",
        batch_size=16,
        adapter=NumpyAdapter(gradient_noise=0.05),
        optimizer_config={"name": "sgd", "lr": 0.3},
        max_steps=40,
        validate_every_n_steps=10,
        callbacks=[monitor, EarlyStopping(monitor="val_rollout_crps_lead_1_4", patience=10)],
        checkpoint=Checkpoint(
            tmp_path / "ckpt",
            every_n_steps=10,
            max_to_keep=1,
            keep_best=1,
            monitor="val_rollout_crps",
            async_save=False,
        ),
        progress=False,
        **kwargs,
    ).run()


def test_a_run_monitors_the_crps_and_keeps_its_best_checkpoint(tmp_path: Path) -> None:
    trajectories = _oscillator()
    monitor = _GaussianMonitor(trajectories, HORIZON, members=4, seed=1, bounds=(4,))
    artifact = _run(tmp_path, monitor)
    steps, values = artifact.history.series("val_rollout_crps")
    assert steps == [10, 20, 30, 40] and all(np.isfinite(values))
    best = steps[int(np.argmin(values))]
    assert set(step_dirs(tmp_path / "ckpt")) == {40, best}
    # the last value is the ensemble of the trained model with the same seed
    report = rollout_validation(
        NeuralForward(artifact.model, head="gaussian"),
        trajectories,
        HORIZON,
        members=4,
        seed=1,
        bounds=(4,),
    )
    assert values[-1] == pytest.approx(report.metrics["val_rollout_crps"], rel=1e-5)


def test_a_point_head_run_with_members_is_refused_before_training(tmp_path: Path) -> None:
    monitor = RolloutMonitor(_oscillator(), HORIZON, members=4)
    with pytest.raises(ConfigError, match=r"point head.*members=4"):
        _run(tmp_path, monitor, gaussian=False)
    assert not (tmp_path / "ckpt").exists() or step_dirs(tmp_path / "ckpt") == []
