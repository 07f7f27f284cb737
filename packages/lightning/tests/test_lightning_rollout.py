"""`TorchModelOp.rollout`: the no-grad device loop equals the host loop (every head, keep, chunk)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipekit_train.core import NeuralForward
from pipekit_train.core.testing import (
    check_corrected_rollout,
    check_device_rollout,
    check_rollout_monitor,
    check_stochastic_rollout,
)
from pipekit_train.lightning import TorchModelOp


def make_op(in_size: int, out_size: int) -> TorchModelOp:
    return TorchModelOp(
        "pipekit_train.lightning.testing:mlp", in_size=in_size, out_size=out_size, width=16, seed=1
    )


@pytest.mark.parametrize("heads", [("point",), ("gaussian", "mixture")])
def test_device_rollout_matches_the_host_loop(heads: tuple[str, ...]) -> None:
    check_device_rollout(make_op, heads=heads, extras=heads == ("point",))


def test_rollout_keeps_the_training_mode_and_takes_tensors() -> None:
    op = make_op(3, 3)
    op.model.train()
    forward = NeuralForward(op, residual=True)
    x = torch.zeros(4, 3)
    got = forward.rollout(x, 5, keep="last")
    assert op.model.training and got.shape == (1, 4, 3) and got.dtype == np.float32
    np.testing.assert_allclose(got[0], forward.rollout(x.numpy(), 5)[-1], rtol=1e-6)


def test_seeded_stochastic_rollouts_repeat_and_have_the_predicted_spread() -> None:
    check_stochastic_rollout(make_op)


@pytest.mark.parametrize("adapter", ["lightning", "torch"])
def test_rollout_monitor_reads_the_moving_average_and_ranks_checkpoints(adapter: str) -> None:
    from pipekit_train.lightning import Lightning, Torch

    check_rollout_monitor(
        make_op(2, 2), Lightning(accelerator="cpu") if adapter == "lightning" else Torch()
    )


def test_a_corrected_model_rolls_out_on_the_device_as_on_the_host() -> None:
    check_corrected_rollout(make_op)
