"""`TorchModelOp(..., layout="channels_last")`: channels-last fields on a torch conv net."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pipekit_train.core import ConfigError, TrainingLoop
from pipekit_train.core.data import ArrayDataset
from pipekit_train.core.testing import (
    conv_forward,
    conv_sizes,
    golden_conv_weights,
    golden_field_task,
)
from pipekit_train.lightning import TorchModelOp

CONV = "pipekit_train.lightning.testing:conv_net"
SIZES = {"in_channels": 2, "out_channels": 2, "width": 4, "depth": 1}


def _fields(n: int = 3, size: int = 6) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((n, size, size, 2)).astype(np.float32)


def test_channels_last_permutes_at_the_boundary() -> None:
    op = TorchModelOp(CONV, layout="channels_last", seed=1, **SIZES)
    plain = TorchModelOp(CONV, seed=1, **SIZES)  # the same module, channels-first
    x = _fields()
    out = op(x)
    assert out.shape == (3, 6, 6, 2)
    reference = plain(np.ascontiguousarray(np.moveaxis(x, -1, 1)))
    np.testing.assert_array_equal(out, np.moveaxis(reference, 1, -1))
    # the hooks add no parameter, buffer or key: the weights are the module's own
    assert op.serialize_weights() == plain.serialize_weights()
    assert list(op.model.state_dict()) == list(plain.model.state_dict())


@pytest.mark.parametrize("dims", [1, 3])
def test_channels_last_moves_the_last_axis_of_any_field(dims: int) -> None:
    """1-D and 3-D fields too (`(N, *spatial, C)`), as on every backend's operator."""
    conv = (torch.nn.Conv1d, torch.nn.Conv3d)[dims // 3]
    torch.manual_seed(0)
    module = conv(2, 3, 3, padding=1)
    x = np.random.default_rng(1).standard_normal((2, *(4,) * dims, 2)).astype(np.float32)
    with torch.no_grad():
        want = module(torch.from_numpy(np.ascontiguousarray(np.moveaxis(x, -1, 1)))).numpy()
    op = TorchModelOp.wrap(module, layout="channels_last")
    np.testing.assert_array_equal(op(x), np.moveaxis(want, 1, -1))


def test_layout_travels_with_the_config_and_weights() -> None:
    op = TorchModelOp(CONV, layout="channels_last", **SIZES)
    config = op.get_config()
    assert config["layout"] == "channels_last"
    assert "layout" not in TorchModelOp(CONV, **SIZES).get_config()  # old records unchanged
    rebuilt = TorchModelOp.from_config(config).with_weights(op.serialize_weights())
    assert rebuilt.layout == "channels_last"
    np.testing.assert_array_equal(rebuilt(_fields()), op(_fields()))
    assert op.copy()(_fields()).shape == (3, 6, 6, 2)
    wrapped = TorchModelOp.wrap(torch.nn.Conv2d(2, 2, 3, padding=1), layout="channels_last")
    assert wrapped(_fields()).shape == (3, 6, 6, 2)


def test_unknown_layout_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"Received: layout='NHWC'"):
        TorchModelOp(CONV, layout="NHWC", **SIZES)


def _loop(model: TorchModelOp, x: np.ndarray, tmp_path: Path) -> TrainingLoop:
    data = ArrayDataset(x=x, y=x)
    from pipekit_train.core import Checkpoint

    return TrainingLoop(
        model=model,
        data=data,
        loss="mse",
        optimizer_config={"name": "adam", "lr": 0.01},
        batch_size=2,
        max_steps=2,
        checkpoint=Checkpoint(tmp_path / "ckpt", every_n_steps=1),
        progress=False,
    )


def test_channels_first_module_on_channels_last_data_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        _loop(TorchModelOp(CONV, **SIZES), _fields(4), tmp_path)
    text = str(info.value)
    assert "Received: data['x'] with samples of shape (6, 6, 2)" in text
    assert "layout='channels_last'" in text
    assert not (tmp_path / "ckpt").exists()  # refused before any work


def test_channels_first_data_is_refused(tmp_path: Path) -> None:
    x = np.ascontiguousarray(np.moveaxis(_fields(4), -1, 1))  # (N, C, H, W)
    op = TorchModelOp(CONV, layout="channels_last", **SIZES)
    with pytest.raises(ConfigError, match=r"channels-first \(C, H, W\).*np.moveaxis") as info:
        _loop(op, x, tmp_path)
    assert "Received: data['x'] with samples of shape (2, 6, 6)" in str(info.value)
    assert not (tmp_path / "ckpt").exists()


def test_conv_from_weights_holds_the_canonical_weights() -> None:
    from pipekit_train.lightning.testing import conv_from_weights

    weights = golden_conv_weights((2, 8, 2))
    op = conv_from_weights(weights)
    assert op.layout == "channels_last" and op.kwargs["kernel_size"] == 3
    assert conv_sizes(weights)["width"] == 8
    train, _ = golden_field_task(n_train=4, n_val=1)
    x = train.get_batch(np.arange(4))["x"]
    np.testing.assert_allclose(op(x), conv_forward(weights, x), rtol=1e-4, atol=1e-5)
