"""Rollouts: a trained emulator used as a forward operator (`NeuralForward`), the closed
loop that advances a state with one (`Cycle`), and the pieces of a device rollout: the
per-step function written once against the array API (`RolloutSpec`) and the segment
plan every backend's `model_op.rollout` runs (`RolloutPlan`, `drive`), and the
rollout-training loss every backend's step minimises (`rollout_loss`) with its input
noise (`rollout_noise`, drawn by core's feed)."""

from ._cycle import Cycle, NeuralForward
from ._loops import jax_rollout, torch_rollout
from ._noise import NOISE_KEY, rollout_noise
from ._plan import (
    SEGMENT_BYTES,
    RolloutPlan,
    check_hook_steps,
    drive,
    first_bad,
    prepare_rollout,
)
from ._posterior import PosteriorEnsemble
from ._step import AffineMap, NonFiniteStateError, RolloutSpec, non_finite_error
from ._train import check_rollout_loss, evaluates_as_rollout, rollout_loss, rollout_spec

__all__ = [
    "NOISE_KEY",
    "SEGMENT_BYTES",
    "AffineMap",
    "Cycle",
    "NeuralForward",
    "NonFiniteStateError",
    "PosteriorEnsemble",
    "RolloutPlan",
    "RolloutSpec",
    "check_hook_steps",
    "check_rollout_loss",
    "evaluates_as_rollout",
    "drive",
    "first_bad",
    "jax_rollout",
    "non_finite_error",
    "prepare_rollout",
    "rollout_loss",
    "rollout_noise",
    "rollout_spec",
    "torch_rollout",
]
