"""`KerasModelOp.rollout`: the device rollout (jax: a jitted loop; torch: a no-grad loop)
equals the host loop (every head, keep, chunk)."""

from __future__ import annotations

import pytest

from pipekit_train.core.testing import (
    check_corrected_rollout,
    check_device_rollout,
    check_rollout_monitor,
    check_stochastic_rollout,
)
from pipekit_train.keras import KerasModelOp


def make_op(in_size: int, out_size: int) -> KerasModelOp:
    return KerasModelOp(
        "pipekit_train.keras.testing:mlp", in_size=in_size, out_size=out_size, width=16, seed=1
    )


def test_device_rollout_matches_the_host_loop() -> None:
    check_device_rollout(make_op, heads=("point",), extras=False, n_steps=6)


@pytest.mark.slow
def test_device_rollout_of_every_head_with_hooks_and_errors() -> None:
    check_device_rollout(make_op, heads=("gaussian", "mixture"))


@pytest.mark.slow
def test_seeded_stochastic_rollouts_repeat_and_have_the_predicted_spread() -> None:
    check_stochastic_rollout(make_op)


def test_rollout_monitor_reads_the_moving_average_and_ranks_checkpoints() -> None:
    check_rollout_monitor(make_op(2, 2))


def test_a_corrected_model_rolls_out_on_the_device_as_on_the_host() -> None:
    check_corrected_rollout(make_op)
