"""Shape checks at `TrainingLoop` construction on Lightning (a one-row forward probe)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pipekit_train.core import Checkpoint, ConfigError, TrainingLoop
from pipekit_train.core.data import ArrayDataset
from pipekit_train.core.testing import regression_task
from pipekit_train.lightning import Lightning, TorchModelOp

MLP = "pipekit_train.lightning.testing:mlp"


def _data(n: int, in_size: int, out_size: int) -> ArrayDataset:
    rng = np.random.default_rng(0)
    return ArrayDataset(
        x=rng.standard_normal((n, in_size)).astype(np.float32),
        y=rng.standard_normal((n, out_size)).astype(np.float32),
    )


def _loop(tmp_path: Path, model: Any = None, **kw: Any) -> TrainingLoop:
    train, val = regression_task(n_train=32, n_val=8)
    args: dict[str, Any] = {
        "model": model or TorchModelOp(MLP, in_size=4, out_size=1, width=8),
        "data": train,
        "validation": val,
        "loss": "mse",
        "batch_size": 8,
        "max_steps": 2,
        "checkpoint": Checkpoint(tmp_path / "ck"),
        "adapter": Lightning(),
        "progress": False,
    }
    args.update(kw)
    return TrainingLoop(**args)


def test_matching_shapes_pass(tmp_path: Path) -> None:
    _loop(tmp_path)
    assert not (tmp_path / "ck").exists()


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.lin(x))


def test_plain_module_mismatch_quotes_torch(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"shape \(5,\) \(float32\).*mat1 and mat2"):
        _loop(tmp_path, _Net(), data=_data(16, 5, 1), validation=None)


def test_probe_keeps_mode_rng_and_weights() -> None:
    net = _Net().train()
    weights = {k: v.clone() for k, v in net.state_dict().items()}
    rng = torch.get_rng_state()
    assert Lightning().output_shape(net, (8, 4), np.dtype("float64")) == (8, 1)
    assert net.training
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in weights.items())
    net.eval()
    Lightning().output_shape(net, (8, 4))
    assert not net.training


def test_unprobed_modules_give_none() -> None:
    class TwoArgs(torch.nn.Module):
        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return x

    lazy = torch.nn.Sequential(torch.nn.LazyLinear(1))
    assert Lightning().output_shape(TwoArgs(), (8, 4)) is None
    assert Lightning().output_shape(lazy, (8, 4)) is None
    assert lazy[0].has_uninitialized_params()  # the probe did not initialise it


def test_user_lightning_module_is_not_probed(lightning_module: Any) -> None:
    class Module(lightning_module.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(3, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x)

    assert Lightning().output_shape(Module(), (8, 4)) is None
