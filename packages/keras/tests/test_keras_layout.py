"""`KerasModelOp(..., layout="channels_last")`: a channels-first Keras model (one sample
`(C, N)`) trains and rolls out on channels-last windows `(N, C)` with no wrapper."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipekit_train.core import (
    Checkpoint,
    ConfigError,
    NeuralForward,
    Rollout,
    TrainingLoop,
    TrajectoryWindows,
    model_op_from_config,
)
from pipekit_train.keras import KerasModelOp

CONV = "pipekit_train.keras.testing:channels_first_conv"
SIZES = {"in_channels": 2, "out_channels": 2, "width": 4}


def _states() -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.cumsum(rng.normal(size=(3, 5, 8, 2)) * 0.1, axis=1).astype(np.float32)


def _loop(op: KerasModelOp, **kw: Any) -> TrainingLoop:
    windows = TrajectoryWindows(_states(), k=2, targets="increments")
    return TrainingLoop(
        op,
        windows,
        loss="mse",
        optimizer_config={"name": "adam", "lr": 0.01},
        batch_size=4,
        max_steps=2,
        shuffle=False,
        progress=False,
        rollout=Rollout(steps=2, residual=True),
        **kw,
    )


def test_channels_last_permutes_at_the_boundary_with_the_models_own_weights() -> None:
    op = KerasModelOp(CONV, layout="channels_last", seed=1, **SIZES)
    plain = KerasModelOp(CONV, seed=1, **SIZES)  # the same model, channels-first
    x = _states()[:, 0]
    want = np.moveaxis(plain(np.ascontiguousarray(np.moveaxis(x, -1, 1))), 1, -1)
    np.testing.assert_allclose(op(x), want, rtol=1e-6, atol=1e-7)
    assert op.serialize_weights() == plain.serialize_weights()  # Permute has no weights


def test_rollout_training_device_rollout_and_the_registry_round_trip() -> None:
    art = _loop(KerasModelOp(CONV, layout="channels_last", seed=1, **SIZES)).run()
    assert len(art.history["loss"]) == 2 and np.isfinite(art.history["loss"]).all()
    op = art.model
    config = op.get_config()
    assert config["layout"] == "channels_last"
    assert "layout" not in KerasModelOp(CONV, **SIZES).get_config()
    again = model_op_from_config(config).with_weights(op.serialize_weights())
    x0 = _states()[:, 0]
    np.testing.assert_array_equal(again(x0), op(x0))
    device = NeuralForward(op, residual=True, state_ndim=2).rollout(x0, 3)
    host = [x0]
    for _ in range(3):
        host.append(host[-1] + op(host[-1]))
    np.testing.assert_allclose(device, np.stack(host), rtol=1e-5, atol=1e-6)


def test_bad_layouts_are_refused_before_work(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"Received: layout='NCW'"):
        KerasModelOp(CONV, layout="NCW", **SIZES)
    op = KerasModelOp(CONV, layout="channels_last", **{**SIZES, "in_channels": 3})
    with pytest.raises(ConfigError, match=r"layout='channels_last'.*in_channels=2"):
        _loop(op, checkpoint=Checkpoint(tmp_path / "ckpt"))
    assert not (tmp_path / "ckpt").exists()
