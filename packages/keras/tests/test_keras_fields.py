"""The keras `conv_net` on channels-last fields: canonical weights, the layout check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipekit_train.core import Checkpoint, ConfigError, TrainingLoop
from pipekit_train.core.data import ArrayDataset
from pipekit_train.core.testing import conv_forward, golden_conv_weights, golden_field_task
from pipekit_train.keras import KerasModelOp
from pipekit_train.keras.testing import conv_from_weights

CONV = "pipekit_train.keras.testing:conv_net"


def test_conv_from_weights_matches_the_numpy_reference() -> None:
    weights = golden_conv_weights((2, 8, 2))
    train, _ = golden_field_task(n_train=4, n_val=1)
    x = train.get_batch(np.arange(4))["x"]
    out = conv_from_weights(weights)(x)
    assert out.shape == x.shape  # periodic padding keeps the grid
    np.testing.assert_allclose(out, conv_forward(weights, x), rtol=1e-4, atol=1e-5)


def test_conv_net_keeps_any_grid() -> None:
    op = KerasModelOp(CONV, in_channels=3, out_channels=1, width=4, depth=1, seed=0)
    x = np.random.default_rng(0).standard_normal((2, 5, 7, 3)).astype(np.float32)
    assert op(x).shape == (2, 5, 7, 1)


def test_conv2d_holds_random_uniform_values() -> None:
    """`conv2d` draws its kernels flat and reshapes them: `RandomUniform`'s own values."""
    import keras

    from pipekit_train.keras.testing import conv2d

    bound = 1.0 / np.sqrt(2 * 3 * 3)
    keras.utils.set_random_seed(7)
    layer = conv2d(3, in_channels=2, kernel_size=3)
    layer.build((None, 5, 5, 2))
    keras.utils.set_random_seed(7)
    ref = keras.layers.Conv2D(
        3,
        3,
        kernel_initializer=keras.initializers.RandomUniform(-bound, bound),
        bias_initializer=keras.initializers.RandomUniform(-bound, bound),
    )
    ref.build((None, 5, 5, 2))
    for got, want in zip(layer.weights, ref.weights, strict=True):
        assert got.shape == want.shape
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(got.value), keras.ops.convert_to_numpy(want.value)
        )


def test_dense_holds_random_uniform_values() -> None:
    """`dense` (the testing MLPs' layer) holds `RandomUniform`'s own values, drawn at a
    power-of-two length and cut on jax: checked at sizes below, at and above a power of two,
    and (on jax) with the older, non-partitionable threefry, where it draws at the shape."""
    import contextlib

    import keras

    cases: list[tuple[int, int, Any]] = [
        (units, fan_in, contextlib.nullcontext()) for units, fan_in in ((3, 5), (16, 16), (40, 33))
    ]
    if keras.backend.backend() == "jax":
        import jax

        cases.append((3, 5, jax.threefry_partitionable(False)))
    for units, fan_in, setting in cases:
        with setting:
            _check_dense(units, fan_in)
    if keras.backend.backend() == "jax":  # drawn inside a traced function: cut in the program
        from pipekit_train.keras.testing import dense

        flat_uniform = type(dense(3, 5).kernel_initializer)
        traced = jax.jit(lambda: flat_uniform(-0.5, 0.5, seed=3)((5, 3)))()
        eager = keras.initializers.RandomUniform(-0.5, 0.5, seed=3)((5, 3))
        np.testing.assert_array_equal(np.asarray(traced), np.asarray(eager))


def _check_dense(units: int, fan_in: int) -> None:
    import keras

    from pipekit_train.keras.testing import dense

    bound = 1.0 / np.sqrt(fan_in)
    keras.utils.set_random_seed(3)
    layer = dense(units, fan_in)
    layer.build((None, fan_in))
    keras.utils.set_random_seed(3)
    ref = keras.layers.Dense(
        units,
        kernel_initializer=keras.initializers.RandomUniform(-bound, bound),
        bias_initializer=keras.initializers.RandomUniform(-bound, bound),
    )
    ref.build((None, fan_in))
    for got, want in zip(layer.weights, ref.weights, strict=True):
        assert got.shape == want.shape
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(got.value), keras.ops.convert_to_numpy(want.value)
        )


def test_channels_first_data_is_refused_before_work(tmp_path: Path) -> None:
    x = np.zeros((4, 2, 6, 6), np.float32)  # (N, C, H, W)
    # the canonical weights' channels (2, 8, 2): their init programs are compiled already
    op = KerasModelOp(CONV, in_channels=2, out_channels=2, width=8, depth=1)
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
