"""Losses: `fn(pred, target) -> scalar`, written once against the Python array API.

The built-in losses run unchanged on numpy, jax (inside `jax.jit` / `jax.grad`) and torch
(autograd) arrays. Names resolve through a registry:

>>> from pipekit_train.core import losses
>>> losses.get("mse") is losses.mse
True
>>> losses.names()
['binary_cross_entropy', 'cross_entropy', 'crps', 'energy_score', 'flow_nll', 'gaussian_crps', 'gaussian_nll', 'huber', 'mae', 'mixture_crps', 'mixture_nll', 'mse']

Every loss is a `Loss` with a JSON `describe()`; compose with `Loss.weighted(...)` or
`losses.mse + 0.1 * losses.mae` (the same object), and `Loss.per_key(...)` for dict
outputs. The mixture's and the flow's layout and log-density (`mixture_width`,
`flow_log_prob`, ...) live beside their distributions in `pipekit_train.core.distributions`
and are re-exported here.

Proper scores of ensembles (`crps`, fair or almost fair, and `energy_score`) train a
generative emulator through rollout training, which builds `members` predictions per
sample; `gaussian_crps` and `mixture_crps` train a Gaussian or a mixture head by its
closed-form CRPS (`pipekit_train.core.losses._ensemble`).
"""

from pipekit_train.core.distributions._flow_math import (
    flow_inverse,
    flow_log_prob,
    flow_transform,
    flow_width,
)
from pipekit_train.core.distributions._mixture_math import mixture_log_prob, mixture_width

from ._compose import (
    Loss,
    PerKeyLoss,
    WeightedLoss,
    describe_callable,
    from_description,
    get,
    names,
    register,
)
from ._ensemble import crps, energy_score, gaussian_crps, mixture_crps
from ._losses import (
    binary_cross_entropy,
    cross_entropy,
    flow_nll,
    gaussian_nll,
    huber,
    mae,
    mixture_nll,
    mse,
)

__all__ = [
    "Loss",
    "PerKeyLoss",
    "WeightedLoss",
    "binary_cross_entropy",
    "crps",
    "cross_entropy",
    "describe_callable",
    "energy_score",
    "flow_inverse",
    "flow_log_prob",
    "flow_nll",
    "flow_transform",
    "flow_width",
    "from_description",
    "gaussian_crps",
    "gaussian_nll",
    "get",
    "huber",
    "mae",
    "mixture_crps",
    "mixture_log_prob",
    "mixture_nll",
    "mixture_width",
    "mse",
    "names",
    "register",
]
