"""`OnlineTrainer` with an Equinox model: one step per call, checkpointable."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipekit_train.core import Checkpoint, ConfigError, OnlineTrainer
from pipekit_train.equinox import Equinox, EquinoxModelOp


def _op() -> EquinoxModelOp:
    return EquinoxModelOp("pipekit_train.equinox.testing:linear", in_size=4, out_size=1, seed=0)


def _batches(regression, n: int, size: int = 8) -> list[dict[str, np.ndarray]]:
    train, _ = regression
    return [train.get_batch(np.arange(i * size, (i + 1) * size) % len(train)) for i in range(n)]


def test_online_learns_and_predicts_before_updating(regression) -> None:
    trainer = OnlineTrainer(_op(), optimizer_config={"name": "sgd", "lr": 0.1})
    batches = _batches(regression, 40)
    first = trainer.model(batches[0]["x"])
    preds = trainer.run(batches)
    np.testing.assert_array_equal(preds[0], first)  # one-step-ahead: predicted before the step
    errors = [float(np.mean((p - b["y"]) ** 2)) for p, b in zip(preds, batches, strict=True)]
    assert np.mean(errors[-5:]) < 0.25 * np.mean(errors[:5])
    assert trainer.step == 40 and np.isfinite(trainer.last_metrics["loss"])
    model = trainer.model
    before = model(batches[0]["x"])
    trainer(batches[0])  # a later (donating) step leaves the handed-out model intact
    np.testing.assert_array_equal(model(batches[0]["x"]), before)


def test_online_batches_of_any_size(regression) -> None:
    trainer = OnlineTrainer(_op(), adapter=Equinox())
    for size in (1, 3, 8):
        assert trainer(_batches(regression, 1, size)[0]).shape == (size, 1)


def test_online_checkpoint_and_resume(regression, tmp_path: Path) -> None:
    policy = Checkpoint(tmp_path, every_n_steps=5, async_save=True)
    batches = _batches(regression, 20)
    trainer = OnlineTrainer(_op(), optimizer_config={"name": "adam", "lr": 0.05}, checkpoint=policy)
    trainer.run(batches[:10])
    trainer.close()
    again = OnlineTrainer(_op(), optimizer_config={"name": "adam", "lr": 0.05}, checkpoint=policy)
    assert again.step == 10
    again.run(batches[10:])
    again.close()
    reference = OnlineTrainer(_op(), optimizer_config={"name": "adam", "lr": 0.05})
    reference.run(batches)
    assert again.model.serialize_weights() == reference.model.serialize_weights()


def test_online_bad_optimizer() -> None:
    with pytest.raises(ConfigError, match="adamw_typo"):
        OnlineTrainer(_op(), optimizer_config={"name": "adamw_typo"})
