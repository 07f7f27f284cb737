"""Distributions: what a trained model's output means, and the mathematics that reads it.

A *head* (`_heads`) names how to read a model's raw output: a point prediction, or a
distribution over the target. Each distribution head has its numpy distribution here
beside its mathematics, so the loss that trains a head (`losses.mixture_nll`,
`losses.flow_nll`) and the distribution that reads it share one layout:

- `Gaussian` (`_gaussian`): a mean and a log-variance per value (`gaussian_nll`).
- `Mixture` (`_mixture`) and the mixture's layout and log-density, written once against
  the Python array API (`_mixture_math`: `mixture_width`, `mixture_log_prob`).
- `Flow` (`_flow`), a conditional normalizing flow, and its transforms, inverse and
  log-density against the array API (`_flow_math`: `flow_width`, `flow_transform`,
  `flow_inverse`, `flow_log_prob`).
- `Ensemble` (`_ensemble`): several networks' distributions mixed as one.
- `BoxPrior`, `LikelihoodPosterior` (`_likelihood`) and `smc_sample` (`_smc`): a trained
  likelihood and a prior read as a posterior, drawn by sequential Monte Carlo.

Everything here is numpy (or array-API) code with no model, no backend and no run: the
room sits just above core's leaves, below `losses`, `model` and `rollout`.
"""

from ._ensemble import Ensemble
from ._flow import Flow, RejectionError, flow_from_output
from ._flow_math import flow_inverse, flow_log_prob, flow_transform, flow_width
from ._gaussian import Gaussian
from ._heads import HEADS, check_head, check_head_options, head_for_loss, head_options_for_loss
from ._likelihood import BoxPrior, LikelihoodPosterior
from ._mixture import Mixture, mixture_from_output
from ._mixture_math import mixture_log_prob, mixture_width
from ._smc import smc_sample

__all__ = [
    "HEADS",
    "BoxPrior",
    "Ensemble",
    "Flow",
    "Gaussian",
    "LikelihoodPosterior",
    "Mixture",
    "RejectionError",
    "check_head",
    "check_head_options",
    "flow_from_output",
    "flow_inverse",
    "flow_log_prob",
    "flow_transform",
    "flow_width",
    "head_for_loss",
    "head_options_for_loss",
    "mixture_from_output",
    "mixture_log_prob",
    "mixture_width",
    "smc_sample",
]
