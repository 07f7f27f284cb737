"""Rollout training through the command line: a `[rollout]` table, windows split by
trajectory and the trajectory normalizer (`normalizer.per`) give the run the same
description in Python gives."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipekit_train.core import ConfigError, Rollout, TrainingLoop
from pipekit_train.core.cli import load_run_config, main
from pipekit_train.core.cli._build import build_loop
from pipekit_train.equinox import EquinoxModelOp

DATA = """
import numpy as np
from pipekit_train.core import ArrayDataset, TrajectoryWindows


def windows(k=4):
    rng = np.random.default_rng(0)
    states = np.cumsum(rng.normal(size=(8, 20, 3)) * 0.2, axis=1).astype(np.float32)
    return TrajectoryWindows(states, k=k, targets="increments")


def pairs():
    x = np.zeros((16, 3), np.float32)
    return ArrayDataset(x=x, y=x)
"""

CONFIG = """
backend = "equinox"
pythonpath = ["."]
max_steps = 6
batch_size = 8
validate_every_n_steps = 3
progress = "none"

[model]
factory = "pipekit_train.equinox.testing:mlp"
kwargs = { in_size = 3, out_size = 3, width = 8 }

[data]
factory = "trajdata:windows"
split = [0.75, 0.25]

[normalizer]
per = "channel"

[rollout]
steps = 4
residual = true
noise_std = 0.01
schedule = { 0 = 2, 3 = 4 }

[[writers]]
type = "jsonl"
uri = "metrics.jsonl"
"""


def _write(tmp_path: Path, config: str = CONFIG) -> Path:
    (tmp_path / "trajdata.py").write_text(DATA)
    path = tmp_path / "run.toml"
    path.write_text(config)
    return path


@pytest.mark.slow
def test_a_rollout_run_through_the_cli_is_the_python_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["run", str(_write(tmp_path))]) == 0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    cli_loss = [r["loss"] for r in records if "loss" in r]
    cli_val = [r["val_loss"] for r in records if "val_loss" in r]

    import trajdata

    train, val = trajdata.windows().split((0.75, 0.25), 0)  # by trajectory
    art = TrainingLoop(
        EquinoxModelOp("pipekit_train.equinox.testing:mlp", in_size=3, out_size=3, width=8, seed=0),
        train,
        val,
        normalizer=train.normalizer(per="channel"),
        rollout=Rollout(steps=4, residual=True, noise_std=0.01, schedule={0: 2, 3: 4}),
        max_steps=6,
        batch_size=8,
        validate_every_n_steps=3,
        progress=False,
    ).run()
    np.testing.assert_allclose(cli_loss, art.history["loss"], rtol=1e-6)
    np.testing.assert_allclose(cli_val, art.history["val_loss"], rtol=1e-6)


def test_the_cli_splits_windows_by_trajectory_and_fits_the_trajectory_normalizer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    built = build_loop(load_run_config(_write(tmp_path)), build_writers=False)
    plan = built.loop.plan
    assert plan.rollout == Rollout(steps=4, residual=True, noise_std=0.01, schedule={0: 2, 3: 4})
    assert built.data_sizes == {"data": 6 * 16, "validation": 2 * 16}  # 6 and 2 trajectories
    np.testing.assert_allclose(
        plan.normalizer.mean["x"], plan.data.normalizer().mean["x"], rtol=1e-12
    )
    assert plan.normalizer.mean["x"].shape == (3,)  # per channel

    # a per-position normalizer with a rollout, or a trajectory one for other data: refused
    keys = CONFIG.replace('per = "channel"', 'keys = ["x", "y"]')
    with pytest.raises(
        ConfigError, match=r'normalizer.keys=\[.x., .y.\].*normalizer.per = "channel"'
    ):
        build_loop(load_run_config(_write(tmp_path, keys)), build_writers=False)
    long = CONFIG.replace("steps = 4", "steps = 5").replace("3 = 4", "3 = 5")
    with pytest.raises(ConfigError, match=r"windows of `data` span k=4 steps.*k >= 5"):
        build_loop(load_run_config(_write(tmp_path, long)), build_writers=False)
    pairs = CONFIG.replace("trajdata:windows", "trajdata:pairs").split("[rollout]")[0]
    with pytest.raises(ConfigError, match=r"`normalizer.per` fits.*is a Subset"):
        build_loop(load_run_config(_write(tmp_path, pairs)), build_writers=False)
