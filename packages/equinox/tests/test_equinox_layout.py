"""`EquinoxModelOp(..., layout="channels_last")`: a channels-first Equinox conv net (one
sample `(C, N)`, as APEBench's pdequinox networks) trains, evaluates and rolls out on
channels-last windows `(N, C)` with no wrapper, exactly as the hand-wrapped module does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
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
from pipekit_train.equinox import EquinoxModelOp

CONV = "pipekit_train.equinox.testing:channels_first_conv"
SIZES = {"num_spatial_dims": 1, "in_channels": 2, "out_channels": 2, "width": 4}


class ChannelsLast(eqx.Module):
    """The wrapper a user had to write: `(N, C)` in, `(N, C)` out, around `(C, N)`."""

    inner: Any

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.moveaxis(self.inner(jnp.moveaxis(x, -1, 0)), 0, -1)


def _states() -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.cumsum(rng.normal(size=(3, 6, 8, 2)) * 0.1, axis=1).astype(np.float32)


def _op(**kw: Any) -> EquinoxModelOp:
    return EquinoxModelOp(CONV, seed=1, **SIZES, **kw)


def _loop(op: EquinoxModelOp, **kw: Any) -> TrainingLoop:
    windows = TrajectoryWindows(_states(), k=2, targets="increments")
    args: dict[str, Any] = {
        "loss": "mse",
        "optimizer_config": {"name": "adam", "lr": 0.01},
        "batch_size": 4,
        "max_steps": 3,
        "shuffle": False,
        "seed": 0,
        "progress": False,
        "validation": windows,
        "rollout": Rollout(steps=2, residual=True),
    }
    args.update(kw)
    return TrainingLoop(op, windows, **args)


@pytest.fixture(scope="module")
def trained() -> tuple[Any, Any]:
    ours = _loop(_op(layout="channels_last")).run()
    plain = _op()
    wrapped = _loop(plain.with_model(ChannelsLast(plain.model))).run()
    return ours, wrapped


def test_training_through_the_op_equals_the_hand_wrapped_module(trained) -> None:
    ours, wrapped = trained
    assert len(ours.history["loss"]) == 3
    np.testing.assert_allclose(ours.history["loss"], wrapped.history["loss"], rtol=1e-6)
    np.testing.assert_allclose(ours.history["val_loss"], wrapped.history["val_loss"], rtol=1e-6)
    got = jax.tree.leaves(eqx.filter(ours.model.model, eqx.is_array))
    want = jax.tree.leaves(eqx.filter(wrapped.model.model.inner, eqx.is_array))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def test_device_rollout_equals_the_host_loop(trained) -> None:
    op = trained[0].model
    x0 = _states()[:, 0]
    device = NeuralForward(op, residual=True, state_ndim=2).rollout(x0, 4)
    host = [x0]
    for _ in range(4):
        host.append(host[-1] + op(host[-1]))
    assert device.shape == (5, 3, 8, 2)
    np.testing.assert_allclose(device, np.stack(host), rtol=1e-5, atol=1e-6)


def test_the_layout_travels_with_the_config_and_weights(trained) -> None:
    op = trained[0].model
    config = op.get_config()
    assert config["layout"] == "channels_last"
    assert "layout" not in _op().get_config()  # configs and resume keys as before
    again = model_op_from_config(config).with_weights(op.serialize_weights())
    assert again.layout == "channels_last"
    x = _states()[:, 1]
    np.testing.assert_array_equal(again(x), op(x))
    assert op(x).shape == (3, 8, 2)


def test_a_layout_outside_the_choices_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"channels_first.*channels_last.*Received: layout='NCW'"):
        _op(layout="NCW")


def test_channels_that_do_not_match_the_data_are_refused_before_work(tmp_path: Path) -> None:
    op = EquinoxModelOp(CONV, **{**SIZES, "in_channels": 3}, layout="channels_last")
    with pytest.raises(ConfigError) as info:
        _loop(op, checkpoint=Checkpoint(tmp_path / "ckpt"))
    text = str(info.value)
    assert "layout='channels_last'" in text and "in_channels=2" in text
    assert "Received: data['x'] with samples of shape (8, 2)" in text
    assert not (tmp_path / "ckpt").exists()
