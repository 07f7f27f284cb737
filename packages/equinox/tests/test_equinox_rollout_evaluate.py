"""A rollout-trained Equinox emulator judged after training: `artifact.evaluate` on
held-out windows reports the loss validation reported, `rollout=` adds the errors per
lead-time window that `RolloutMonitor` recorded, and the registry record carries both."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipekit_train.core import (
    ConfigError,
    LocalModelRegistry,
    Rollout,
    RolloutMonitor,
    TrainingLoop,
    TrajectoryWindows,
)
from pipekit_train.core.data import Trajectories
from pipekit_train.equinox import EquinoxModelOp

HORIZON = 12


@pytest.fixture(scope="module")
def run():
    rng = np.random.default_rng(0)
    states = np.cumsum(rng.normal(size=(10, 24, 3)) * 0.2, axis=1).astype(np.float32)
    train, held_out = Trajectories(states).split((0.7, 0.3), 0)
    windows = TrajectoryWindows(train, k=3, targets="increments")
    val = TrajectoryWindows(held_out, k=3, targets="increments")
    monitor = RolloutMonitor(held_out, HORIZON, residual=True)
    artifact = TrainingLoop(
        EquinoxModelOp("pipekit_train.equinox.testing:mlp", in_size=3, out_size=3, width=8, seed=0),
        windows,
        val,
        normalizer=windows.normalizer(),
        rollout=Rollout(steps=3, weights=(1.0, 2.0, 3.0), residual=True),
        metrics=["mae"],
        callbacks=[monitor],
        batch_size=16,
        max_steps=8,
        validate_every_n_steps=8,
        progress=False,
    ).run()
    return artifact, val, held_out, monitor


def test_evaluate_on_held_out_windows_is_the_validation_of_the_run(run) -> None:
    artifact, val, _, _ = run
    out = artifact.evaluate(val)  # the longest rollout's weighted loss, numpy, no backend
    np.testing.assert_allclose(out["loss"], artifact.final_metrics["val_loss"], rtol=1e-5)
    np.testing.assert_allclose(out["mae"], artifact.final_metrics["val_mae"], rtol=1e-5)
    with pytest.raises(ConfigError, match=r"trained through the rollout.*k>=3"):
        artifact.evaluate(TrajectoryWindows(val.trajectories, k=2, targets="increments"))


def test_evaluate_adds_the_rollout_errors_and_the_registry_records_them(run, tmp_path) -> None:
    artifact, val, held_out, monitor = run
    out = artifact.evaluate(val, rollout={"horizon": HORIZON})
    want = monitor.last_report.metrics  # the monitor at the last validation: same weights
    assert {f"val_{k}" for k in out if k.startswith("rollout_")} == set(want)
    for name, value in want.items():
        np.testing.assert_allclose(out[name.removeprefix("val_")], value, rtol=1e-5)
    # the default horizon is the whole held-out trajectories
    whole = artifact.evaluate(val, rollout=True)
    assert f"rollout_nrmse_lead_11_{held_out.length - 1}" in whole

    record = artifact.register(LocalModelRegistry(tmp_path), "emulator", test_metrics=out)
    assert record.metrics["val_rollout_nrmse"] == artifact.final_metrics["val_rollout_nrmse"]
    assert record.metrics["test_rollout_nrmse_lead_1_10"] == out["rollout_nrmse_lead_1_10"]
    again = LocalModelRegistry(tmp_path).record("emulator")
    assert again.metrics["test_rollout_vrmse_lead_11_12"] == out["rollout_vrmse_lead_11_12"]

    with pytest.raises(ConfigError, match=r"`rollout` options are.*unknown: \['horizn'\]"):
        artifact.evaluate(val, rollout={"horizn": 5})


def test_the_error_against_lead_time_figure_is_one_call(run, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    artifact, _, held_out, _ = run
    report = artifact.rollout(held_out, HORIZON, dt=0.05)
    assert report.errors["nrmse"].shape == (HORIZON, 1)
    report.figure(tmp_path / "rollout.png")
    assert (tmp_path / "rollout.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
