"""Trained networks used as forward operators and posteriors, and rolled out.

- `NeuralForward` (`_cycle`): a trained model as a forward operator (state → next state)
  and as a posterior (`distribution(x)`); `Cycle`, the closed loop that advances a state
  with any forward operator. `posterior_forward` and `PosteriorEnsemble` (`_posterior`):
  one run's model, and several trained posteriors, read as one posterior.
- The device rollout every backend's `model_op.rollout` runs: the per-step function
  written once against the array API (`RolloutSpec`, `_step`), the steps it keeps and its
  segments (`SegmentedRollout`, formerly `RolloutPlan`, and `drive`: `_segments`) and the
  device loops for jax and torch (`_loops`).
- Rollout training: the loss every backend's step minimises (`rollout_loss`, `_train`)
  its input noise and ensemble training's member noise (`rollout_noise`,
  `member_noise`, `_noise`, drawn by core's feed); rollout
  validation on held-out trajectories (`rollout_validation`, `_validation`).

The model operator itself is `pipekit_train.core.model`'s and what its output means
`pipekit_train.core.distributions`'; this room imports neither `model` nor anything above.
"""

from ._cycle import Cycle, NeuralForward
from ._loops import jax_rollout, torch_rollout
from ._noise import MEMBER_NOISE_KEY, NOISE_KEY, member_noise, rollout_noise
from ._posterior import PosteriorEnsemble
from ._segments import (
    SEGMENT_BYTES,
    RolloutPlan,
    SegmentedRollout,
    check_hook_steps,
    drive,
    first_bad,
    prepare_rollout,
)
from ._step import AffineMap, NonFiniteStateError, RolloutSpec, non_finite_error
from ._train import check_rollout_loss, evaluates_as_rollout, rollout_loss, rollout_spec

__all__ = [
    "MEMBER_NOISE_KEY",
    "NOISE_KEY",
    "SEGMENT_BYTES",
    "AffineMap",
    "Cycle",
    "NeuralForward",
    "NonFiniteStateError",
    "PosteriorEnsemble",
    "RolloutPlan",
    "RolloutSpec",
    "SegmentedRollout",
    "check_hook_steps",
    "check_rollout_loss",
    "evaluates_as_rollout",
    "drive",
    "first_bad",
    "jax_rollout",
    "member_noise",
    "non_finite_error",
    "prepare_rollout",
    "rollout_loss",
    "rollout_noise",
    "rollout_spec",
    "torch_rollout",
]
