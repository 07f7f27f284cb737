"""The equinox `conv_net` on channels-last fields: canonical weights, the layout check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipekit_train.core import Checkpoint, ConfigError, TrainingLoop
from pipekit_train.core.data import ArrayDataset
from pipekit_train.core.testing import conv_forward, golden_conv_weights, golden_field_task
from pipekit_train.equinox import EquinoxModelOp
from pipekit_train.equinox.testing import conv_from_weights

CONV = "pipekit_train.equinox.testing:conv_net"


def test_conv_from_weights_matches_the_numpy_reference() -> None:
    weights = golden_conv_weights((2, 8, 2))
    train, _ = golden_field_task(n_train=4, n_val=1)
    x = train.get_batch(np.arange(4))["x"]
    out = conv_from_weights(weights)(x)
    assert out.shape == x.shape  # periodic padding keeps the grid
    np.testing.assert_allclose(out, conv_forward(weights, x), rtol=1e-4, atol=1e-5)


def test_conv_net_keeps_any_grid() -> None:
    op = EquinoxModelOp(CONV, in_channels=3, out_channels=1, width=4, depth=1, seed=0)
    x = np.random.default_rng(0).standard_normal((2, 5, 7, 3)).astype(np.float32)
    assert op(x).shape == (2, 5, 7, 1)


def test_conv_net_holds_equinox_initial_values() -> None:
    """`conv_net` draws its kernels flat and reshapes them: the values Equinox draws itself."""
    import equinox as eqx
    import jax

    net = EquinoxModelOp(CONV, in_channels=2, out_channels=3, depth=0, seed=5).model
    (key,) = jax.random.split(jax.random.PRNGKey(5), 1)
    ref = eqx.nn.Conv2d(2, 3, 3, padding=1, padding_mode="CIRCULAR", key=key)
    (layer,) = net.layers
    assert layer.weight.shape == ref.weight.shape and layer.bias.shape == ref.bias.shape
    np.testing.assert_array_equal(layer.weight, ref.weight)
    np.testing.assert_array_equal(layer.bias, ref.bias)


def test_channels_first_data_is_refused_before_work(tmp_path: Path) -> None:
    x = np.zeros((4, 2, 6, 6), np.float32)  # (N, C, H, W)
    op = EquinoxModelOp(CONV, in_channels=2, out_channels=2, width=8, depth=1)
    with pytest.raises(ConfigError, match=r"channels-first \(C, H, W\)") as info:
        TrainingLoop(
            model=op,
            data=ArrayDataset(x=x, y=x),
            loss="mse",
            optimizer_config={"name": "adam", "lr": 0.01},
            batch_size=2,
            max_steps=2,
            checkpoint=Checkpoint(tmp_path / "ckpt", every_n_steps=1),
            progress=False,
        )
    assert "Received: data['x'] with samples of shape (2, 6, 6)" in str(info.value)
    assert "np.moveaxis(x, 1, -1)" in str(info.value)
    assert not (tmp_path / "ckpt").exists()
