"""The built-in losses, written once against the Python array API.

Each function finds the array library of its inputs with
`array_api_compat.array_namespace(pred, target)` and uses only array-API functions, so
the same code runs on numpy arrays, on jax arrays (inside `jax.jit` and `jax.grad`) and on
torch tensors (autograd works through it). Nothing here imports a backend.

Conventions shared by every built-in loss:

- The result is a 0-d array of the input's library: the mean over every element (batch
  and feature axes alike; for classification, the mean over samples).
- The result has `pred`'s floating dtype: a target of another dtype (float64 data with a
  float32 model, integer labels for a regression) is cast to `pred`'s dtype first.
- `pred` and `target` must have exactly the same shape (no broadcasting: a `(n, 1)`
  prediction against a `(n,)` target is the classic silent bug, so it is an error). The
  classification losses document their own shape rules.
- A target from another library than `pred` (e.g. a numpy target with a torch
  prediction) is converted with `xp.asarray` onto `pred`'s device.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import array_api_compat

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.distributions._flow_math import FLOW_DEFAULTS, flow_log_prob
from pipekit_train.core.distributions._flow_math import check_params as _check_flow
from pipekit_train.core.distributions._mixture_math import check_params as _check_mixture
from pipekit_train.core.distributions._mixture_math import mixture_log_prob

from ._compose import Loss, register

__all__ = [
    "binary_cross_entropy",
    "cross_entropy",
    "flow_nll",
    "gaussian_nll",
    "huber",
    "mae",
    "mixture_nll",
    "mse",
]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


# --------------------------------------------------------------------------- helpers


def _namespace(pred: Any, target: Any, field: str = "pred") -> tuple[Any, Any, Any]:
    """Return `(xp, pred, target)` with `target` in `pred`'s library."""
    try:
        xp = array_api_compat.array_namespace(pred)
    except TypeError as exc:
        raise ConfigError(
            f"`{field}` must be an array (numpy, jax or torch). "
            f"Received: {field} of type {type(pred).__name__}. Pass the model output array."
        ) from exc
    try:
        xp = array_api_compat.array_namespace(pred, target)
    except TypeError:
        target = xp.asarray(target, device=array_api_compat.device(pred))
    if not hasattr(target, "shape"):  # a Python scalar
        target = xp.asarray(target, device=array_api_compat.device(pred))
    return xp, pred, target


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in x.shape)


def _check_same_shape(name: str, pred: Any, target: Any, pred_field: str = "pred") -> None:
    if _shape(pred) != _shape(target):
        raise ConfigError(
            f"`{pred_field}` and `target` must have the same shape for `{name}`. "
            f"Received: {pred_field}.shape={_shape(pred)}, target.shape={_shape(target)}. "
            "Reshape one of them (e.g. give the target a trailing axis of size 1, or squeeze "
            "the prediction); broadcasting is refused because it silently computes the wrong loss."
        )


def _cast_like(xp: Any, target: Any, pred: Any) -> Any:
    if target.dtype != pred.dtype and xp.isdtype(pred.dtype, "real floating"):
        return xp.astype(target, pred.dtype)
    return target


def _regression_inputs(name: str, pred: Any, target: Any) -> tuple[Any, Any, Any]:
    """Namespace, same-shape check and dtype cast shared by the regression losses/metrics."""
    xp, pred, target = _namespace(pred, target)
    _check_same_shape(name, pred, target)
    return xp, pred, _cast_like(xp, target, pred)


def _log_softmax(xp: Any, logits: Any) -> Any:
    shifted = logits - xp.max(logits, axis=-1, keepdims=True)
    return shifted - xp.log(xp.sum(xp.exp(shifted), axis=-1, keepdims=True))


def _class_probabilities(name: str, xp: Any, logits: Any, target: Any) -> Any:
    """Turn integer class targets `(...)` or one-hot/probability targets `(..., C)` into
    probabilities `(..., C)` in `logits`' dtype."""
    if logits.ndim < 1:
        raise ConfigError(
            f"`pred` must hold logits with the classes on the last axis for `{name}`. "
            f"Received: pred.shape={_shape(logits)}. Return logits of shape (batch, classes)."
        )
    if _shape(target) == _shape(logits)[:-1]:
        if not xp.isdtype(target.dtype, "integral"):
            raise ConfigError(
                f"`target` without the class axis must hold integer class indices for `{name}`. "
                f"Received: target.dtype={target.dtype}, target.shape={_shape(target)}. "
                "Cast the labels to an integer dtype, or pass one-hot targets of the logits' shape."
            )
        classes = xp.arange(logits.shape[-1], device=array_api_compat.device(logits))
        return xp.astype(xp.expand_dims(target, axis=-1) == classes, logits.dtype)
    if _shape(target) == _shape(logits):
        return _cast_like(xp, target, logits)
    raise ConfigError(
        f"`target` must be integer class indices of shape pred.shape[:-1] or one-hot "
        f"probabilities of pred's shape for `{name}`. Received: pred.shape={_shape(logits)}, "
        f"target.shape={_shape(target)}. Reshape the labels to one of these forms."
    )


# --------------------------------------------------------------------------- losses


def _mse(pred: Any, target: Any) -> Any:
    """Mean squared error: `mean((pred - target)**2)` over every element."""
    xp, pred, target = _regression_inputs("mse", pred, target)
    diff = pred - target
    return xp.mean(diff * diff)


def _mae(pred: Any, target: Any) -> Any:
    """Mean absolute error: `mean(|pred - target|)` over every element."""
    xp, pred, target = _regression_inputs("mae", pred, target)
    return xp.mean(xp.abs(pred - target))


def _huber(pred: Any, target: Any, *, delta: float = 1.0) -> Any:
    """Huber loss: quadratic `0.5*d**2` for `|d| <= delta`, linear `delta*(|d| - 0.5*delta)`
    beyond, averaged over every element (same as `torch.nn.functional.huber_loss`)."""
    xp, pred, target = _regression_inputs("huber", pred, target)
    diff = pred - target
    abs_diff = xp.abs(diff)
    quadratic = 0.5 * diff * diff
    linear = delta * (abs_diff - 0.5 * delta)
    return xp.mean(xp.where(abs_diff <= delta, quadratic, linear))


def _check_huber(params: dict[str, Any]) -> None:
    delta = params.get("delta")
    if (
        isinstance(delta, bool)
        or not isinstance(delta, numbers.Real)
        or not math.isfinite(delta)
        or delta <= 0
    ):
        raise ConfigError(
            f"`delta` must be a positive finite number for `huber`. Received: delta={delta!r}. "
            "Pass e.g. huber(delta=1.0)."
        )


def _split_gaussian(pred: Any) -> tuple[Any, Any]:
    if isinstance(pred, Mapping):
        missing = [k for k in ("mean", "log_var") if k not in pred]
        if missing:
            raise ConfigError(
                f"`pred` as a dict must have the keys 'mean' and 'log_var' for `gaussian_nll`. "
                f"Received: pred keys {sorted(map(str, pred))}. Return "
                "{'mean': ..., 'log_var': ...} from the model."
            )
        return pred["mean"], pred["log_var"]
    try:
        array_api_compat.array_namespace(pred)
    except TypeError as exc:
        raise ConfigError(
            "`pred` must be an array or a dict {'mean', 'log_var'} for `gaussian_nll`. "
            f"Received: pred of type {type(pred).__name__}."
        ) from exc
    width = pred.shape[-1] if pred.ndim >= 1 else 0
    if pred.ndim < 1 or width % 2 != 0:
        raise ConfigError(
            "`pred` must have an even-sized last axis for `gaussian_nll`: its first half is "
            f"the mean, its second half the log-variance. Received: pred.shape={_shape(pred)}. "
            "Give the model 2*k outputs for k targets, or return {'mean': ..., 'log_var': ...}."
        )
    half = width // 2
    return pred[..., :half], pred[..., half:]


def _gaussian_nll(pred: Any, target: Any, *, full: bool = False) -> Any:
    """Gaussian negative log-likelihood with a predicted mean and log-variance.

    `pred` is either a dict `{"mean": m, "log_var": s}` or one array whose last axis is
    split in two halves: `pred[..., :k]` is the mean and `pred[..., k:]` the log-variance
    (so the model has `2*k` outputs for a target with `k` on its last axis). The loss is
    `0.5 * (log_var + (target - mean)**2 * exp(-log_var))`, averaged over every element;
    with `full=True` the constant `0.5*log(2*pi)` is added (the exact NLL). The default,
    without the constant, matches `torch.nn.GaussianNLLLoss(full=False)` with
    `var=exp(log_var)`.
    """
    mean, log_var = _split_gaussian(pred)
    xp, mean, target = _namespace(mean, target, field="pred")
    _check_same_shape("gaussian_nll", mean, target, pred_field="mean")
    _check_same_shape("gaussian_nll", mean, log_var, pred_field="mean")
    target = _cast_like(xp, target, mean)
    diff = target - mean
    nll = 0.5 * (log_var + diff * diff * xp.exp(-log_var))
    if full:
        nll = nll + _HALF_LOG_2PI
    return xp.mean(nll)


def _check_gaussian(params: dict[str, Any]) -> None:
    if not isinstance(params.get("full"), bool):
        raise ConfigError(
            f"`full` must be True or False for `gaussian_nll`. Received: full={params.get('full')!r}."
        )


def _cross_entropy(pred: Any, target: Any) -> Any:
    """Softmax cross-entropy from logits.

    `pred` holds logits with the classes on the last axis, shape `(..., C)`. `target` is
    either integer class indices of shape `(...)` or one-hot / class-probability targets
    of shape `(..., C)`. Computed with a stable log-softmax; averaged over samples.
    Integer labels outside `[0, C)` are not checked (they contribute zero).
    """
    xp, pred, target = _namespace(pred, target)
    probs = _class_probabilities("cross_entropy", xp, pred, target)
    return -xp.mean(xp.sum(probs * _log_softmax(xp, pred), axis=-1))


def _binary_cross_entropy(pred: Any, target: Any) -> Any:
    """Sigmoid binary cross-entropy from logits (numerically stable).

    `pred` holds logits `x`, `target` labels or probabilities `z` in `[0, 1]` of the same
    shape. Uses `max(x, 0) - x*z + log1p(exp(-|x|))`, which never overflows; averaged
    over every element (same as `torch.nn.functional.binary_cross_entropy_with_logits`).
    """
    xp, pred, target = _regression_inputs("binary_cross_entropy", pred, target)
    relu = xp.maximum(pred, xp.zeros_like(pred))
    return xp.mean(relu - pred * target + xp.log1p(xp.exp(-xp.abs(pred))))


def _mixture_nll(pred: Any, target: Any, *, n_components: int = 1, covariance: str = "diag") -> Any:
    """Gaussian-mixture negative log-likelihood, averaged over samples.

    `pred` holds `mixture_width(n_components, d, covariance)` values per sample: weight
    logits, means and log-scales (and, for `covariance="full"`, the strictly-lower
    Cholesky entries), see `pipekit_train.core.distributions._mixture_math`; `target` has
    `d` values on its last axis and `pred`'s other axes. The result is
    `-mean(mixture_log_prob(pred, target))`, the exact NLL (with the `0.5*d*log(2*pi)`
    constant).
    """
    lp = mixture_log_prob(pred, target, n_components=n_components, covariance=covariance)
    return -array_api_compat.array_namespace(lp).mean(lp)


def _flow_nll(
    pred: Any,
    target: Any,
    *,
    flow_layers: int = 4,
    flow_bins: int = 8,
    flow_bound: float = 3.0,
    flow_hidden: int = 0,
) -> Any:
    """Conditional normalizing-flow negative log-likelihood, averaged over samples.

    `pred` holds `flow_width(d, flow_layers, flow_bins, flow_hidden)` values per sample
    (layout in `pipekit_train.core.distributions._flow_math`); `target` has `d` values on
    its last axis and `pred`'s other axes. The result is
    `-mean(flow_log_prob(pred, target))`, the exact NLL.
    """
    lp = flow_log_prob(
        pred,
        target,
        flow_layers=flow_layers,
        flow_bins=flow_bins,
        flow_bound=flow_bound,
        flow_hidden=flow_hidden,
    )
    return -array_api_compat.array_namespace(lp).mean(lp)


# --------------------------------------------------------------------------- registered

mse: Loss = register("mse", _mse)
"""Mean squared error (see the module docstring for shapes and dtypes)."""

mae: Loss = register("mae", _mae)
"""Mean absolute error."""

huber: Loss = register("huber", Loss(_huber, params={"delta": 1.0}, check=_check_huber))
"""Huber loss; `huber(pred, target)` uses `delta=1.0`, `huber(delta=0.5)` configures it."""

gaussian_nll: Loss = register(
    "gaussian_nll", Loss(_gaussian_nll, params={"full": False}, check=_check_gaussian)
)
"""Gaussian NLL from mean and log-variance; `gaussian_nll(full=True)` adds `0.5*log(2*pi)`."""

mixture_nll: Loss = register(
    "mixture_nll",
    Loss(_mixture_nll, params={"n_components": 1, "covariance": "diag"}, check=_check_mixture),
)
"""Gaussian-mixture NLL; `mixture_nll(n_components=5)` (diagonal) or `covariance="full"`.

The network's output layout (weight logits, means, log-scales, Cholesky entries) is
documented in `pipekit_train.core.distributions._mixture_math`; `losses.mixture_width` gives its size.
"""

flow_nll: Loss = register(
    "flow_nll", Loss(_flow_nll, params=dict(FLOW_DEFAULTS), check=_check_flow)
)
"""Conditional normalizing-flow NLL; `flow_nll(flow_layers=4, flow_bins=8, flow_bound=3.0)`.

The network outputs every parameter of the flow (splines and mixing maps, layer by
layer); the layout is documented in `pipekit_train.core.distributions._flow_math` and
`losses.flow_width` gives its size. `flow_nll(flow_hidden=32)` couples the values inside
each layer (the second half's splines conditioned on the first half by a small network
whose weights are part of the output); the default 0 is the element-wise flow.
"""

cross_entropy: Loss = register("cross_entropy", _cross_entropy)
"""Softmax cross-entropy from logits with integer or one-hot targets."""

binary_cross_entropy: Loss = register("binary_cross_entropy", _binary_cross_entropy)
"""Sigmoid binary cross-entropy from logits."""
