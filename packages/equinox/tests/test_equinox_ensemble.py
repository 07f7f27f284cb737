"""Ensembles trained by the CRPS on Equinox: the validation's members, the refusal of a
model without the noise channels, the device rollout and the registry handoff."""

from __future__ import annotations

import numpy as np
import pytest

from pipekit_train.core import (
    ConfigError,
    Cycle,
    LocalModelRegistry,
    NeuralForward,
    Rollout,
    RolloutMonitor,
    TrainingLoop,
    losses,
)
from pipekit_train.core.testing import golden_rollout_task
from pipekit_train.equinox import Equinox, EquinoxModelOp

CRPS = losses.crps(members=3, noise_dim=2)


def _loop(in_size: int = 4, **overrides) -> TrainingLoop:
    train, val = golden_rollout_task()
    kwargs = dict(
        model=EquinoxModelOp(
            "pipekit_train.equinox.testing:mlp", in_size=in_size, out_size=2, width=16, seed=0
        ),
        data=train,
        validation=val,
        normalizer=train.normalizer(),
        rollout=Rollout(steps=2, residual=True),
        loss=CRPS,
        optimizer_config={"name": "adam", "lr": 0.01},
        batch_size=16,
        max_steps=12,
        validate_every_n_steps=6,
        seed=1,
        adapter=Equinox(),
        progress=False,
    )
    kwargs.update(overrides)
    return TrainingLoop(**kwargs)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory):
    _, val = golden_rollout_task()
    monitor = RolloutMonitor(val.trajectories, 6, residual=True, members=4, seed=2)
    artifact = _loop(callbacks=[monitor]).run()
    return artifact, monitor, val


def test_validation_scores_the_same_members_as_evaluate(trained) -> None:
    """Both draw the validation members from the run's seed and the batch index."""
    artifact, _, val = trained
    again = artifact.evaluate(val)["loss"]
    assert again == pytest.approx(artifact.final_metrics["val_loss"], rel=1e-5)
    losses_seen = artifact.history["loss"]
    assert np.all(np.isfinite(losses_seen)) and losses_seen[-1] < losses_seen[0]


def test_rollout_monitor_scores_the_generative_ensemble(trained) -> None:
    artifact, monitor, _ = trained
    metrics = artifact.final_metrics
    for name in ("val_rollout_crps", "val_rollout_spread_skill", "val_rollout_ens_rmse"):
        assert np.isfinite(metrics[name]) and metrics[name] > 0, name
    assert monitor.last_report is not None and monitor.last_report.members == 4
    # the artifact's own rollout of the same ensemble (the last weights: the same step)
    again = artifact.rollout(monitor.trajectories, 6, members=4, seed=2, prefix="val_rollout_")
    assert again.metrics["val_rollout_crps"] == pytest.approx(metrics["val_rollout_crps"], rel=1e-4)


def test_device_rollout_draws_members_and_the_registry_keeps_the_head(trained, tmp_path) -> None:
    artifact, _, val = trained
    registry = LocalModelRegistry(tmp_path / "registry")
    artifact.register(registry, "crps-pendulum")
    record, op = registry.load_record_and_model("crps-pendulum")
    assert record.head == "generative" and record.head_options == {"noise_dim": 2}
    forward = NeuralForward.from_record(record, op, residual=True)
    assert forward.on_device
    x0 = np.repeat(np.asarray(val.get_batch(np.array([0]))["x"], np.float32), 8, axis=0)
    a = forward.rollout(x0, 6, stochastic=True, seed=5)
    assert np.array_equal(a, forward.rollout(x0, 6, stochastic=True, seed=5))
    assert float(a[-1].std(axis=0).max()) > 0  # the members differ
    central = forward.rollout(x0[:1], 6)  # zero noise: the host's central member
    host = [x0[:1]]
    for _ in range(6):
        host.append(forward(host[-1]))
    np.testing.assert_allclose(central, np.stack(host), rtol=1e-5, atol=1e-6)
    # a stochastic Cycle with hooks: on the device between them; its first segment is
    # the rollout with the same seed, the next segments draw anew
    cycle = Cycle(forward, 6, hook=lambda step, s: None, hook_steps=3, stochastic=True, seed=5)
    assert cycle.on_device
    run = cycle.run(x0)
    np.testing.assert_array_equal(run[:4], a[:4])
    assert not np.allclose(run[4:], a[4:])
    np.testing.assert_array_equal(run, cycle.run(x0))


def test_a_model_without_the_noise_channels_is_refused_before_any_work(tmp_path) -> None:
    from pipekit_train.core import Checkpoint

    with pytest.raises(ConfigError, match="noise_dim=2 noise channels") as info:
        _loop(in_size=2, checkpoint=Checkpoint(tmp_path / "ck"))
    assert "4 input channels" in str(info.value)
    assert not (tmp_path / "ck").exists()


def test_a_field_emulator_trains_with_noise_channels_at_every_grid_point() -> None:
    """(N, C) fields: a periodic channels-first conv net (`layout="channels_last"`) of the
    state's 2 channels and 1 noise channel per grid point; validation and the device
    rollout of members run on the fields."""
    rng = np.random.default_rng(0)
    traj = np.cumsum(rng.normal(size=(4, 12, 16, 2)) * 0.1, axis=1).astype(np.float32)
    from pipekit_train.core.data import TrajectoryWindows

    train = TrajectoryWindows(traj[:3], k=2, targets="increments")
    artifact = TrainingLoop(
        model=EquinoxModelOp(
            "pipekit_train.equinox.testing:channels_first_conv",
            num_spatial_dims=1,
            in_channels=3,
            out_channels=2,
            layout="channels_last",
        ),
        data=train,
        validation=TrajectoryWindows(traj[3:], k=2, targets="increments"),
        normalizer=train.normalizer(),
        rollout=Rollout(steps=2, residual=True),
        loss=losses.crps(members=3, noise_dim=1),
        batch_size=8,
        max_steps=4,
        validate_every_n_steps=4,
        adapter=Equinox(),
        progress=False,
    ).run()
    assert np.isfinite(artifact.final_metrics["val_loss"])
    forward = NeuralForward(
        artifact.model,
        normalizer=artifact.normalizer,
        residual=True,
        head="generative",
        noise_dim=1,
        state_ndim=2,
    )
    members = forward.rollout(np.repeat(traj[3:, 0], 4, axis=0), 3, stochastic=True, seed=1)
    assert members.shape == (4, 4, 16, 2) and float(members[-1].std(axis=0).mean()) > 0
    # the noise channels count in the model's layout check: a model of the state alone
    # (2 input channels) is refused, naming the noise
    with pytest.raises(ConfigError, match="noise_dim=1 noise channels"):
        TrainingLoop(
            model=EquinoxModelOp(
                "pipekit_train.equinox.testing:channels_first_conv",
                num_spatial_dims=1,
                in_channels=2,
                out_channels=2,
                layout="channels_last",
            ),
            data=train,
            rollout=Rollout(steps=2, residual=True),
            loss=losses.crps(members=3, noise_dim=1),
            max_steps=1,
            batch_size=8,
            adapter=Equinox(),
            progress=False,
        )
