"""`EquinoxModelOp.rollout`: the device rollout equals the host loop (every head, keep, chunk)."""

from __future__ import annotations

import numpy as np
import pytest

from pipekit_train.core import NeuralForward
from pipekit_train.core.testing import (
    check_corrected_rollout,
    check_device_rollout,
    check_rollout_monitor,
    check_stochastic_rollout,
)
from pipekit_train.equinox import EquinoxModelOp


def make_op(in_size: int, out_size: int) -> EquinoxModelOp:
    return EquinoxModelOp(
        "pipekit_train.equinox.testing:mlp", in_size=in_size, out_size=out_size, width=16, seed=1
    )


def test_device_rollout_matches_the_host_loop() -> None:
    check_device_rollout(make_op, heads=("point",))


@pytest.mark.slow
def test_device_rollout_of_gaussian_and_mixture_heads() -> None:
    check_device_rollout(make_op, heads=("gaussian", "mixture"), extras=False)


def test_segments_reuse_one_compilation() -> None:
    op = make_op(3, 3)
    forward = NeuralForward(op, residual=True)
    x = np.zeros((4, 3))
    forward.rollout(x, 7, chunk=3)
    forward.rollout(x, 11, chunk=3)
    segments = [v for k, v in op._rollouts.items() if k != "tree"]
    assert len(segments) == 1
    ((_, compiled),) = segments
    assert compiled._cache_size() == 1  # one (rows, stride) for every segment length


def test_seeded_stochastic_rollouts_repeat_and_have_the_predicted_spread() -> None:
    check_stochastic_rollout(make_op, heads=("gaussian",))


@pytest.mark.slow
def test_seeded_stochastic_rollouts_of_mixture_heads() -> None:
    check_stochastic_rollout(make_op, heads=("mixture",))


def test_rollout_monitor_reads_the_moving_average_and_ranks_checkpoints() -> None:
    check_rollout_monitor(make_op(2, 2))


def test_a_corrected_model_rolls_out_on_the_device_as_on_the_host() -> None:
    check_corrected_rollout(make_op)
