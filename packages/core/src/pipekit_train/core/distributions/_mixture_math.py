"""A Gaussian mixture's layout and log-density, written once against the array API.

A mixture density network predicts, per sample, a mixture of `K` Gaussians over a target
of `d` values. The network's output has one last axis holding, in this order
(`K` components, component-major):

| slice of the last axis                    | meaning                                            |
|-------------------------------------------|----------------------------------------------------|
| `[0, K)`                                  | logits of the mixture weights (softmax over `K`)   |
| `[K, K + K*d)`                            | means, `(K, d)` row-major: component `k` at `K + k*d` |
| `[K + K*d, K + 2*K*d)`                    | log-scales, `(K, d)`: `log` of the standard deviation per value (diagonal), or `log` of the Cholesky factor's diagonal (full) |
| `[K + 2*K*d, K + 2*K*d + K*d*(d-1)/2)`    | full covariance only: the strictly-lower Cholesky entries, `(K, d*(d-1)/2)`, row by row (`(1,0), (2,0), (2,1), (3,0), ...`) |

So the width is `K * (1 + 2*d)` for `covariance="diag"` and `K * (1 + 2*d + d*(d-1)/2)`
for `covariance="full"` (`mixture_width`). With the full parametrisation component `k`'s
covariance is `L_k @ L_k.T` with `L_k` lower triangular, `exp(log-scale)` on its diagonal:
positive definite for any network output.

`mixture_log_prob` is the exact log-density (the `0.5*d*log(2*pi)` constant included),
per sample: `logsumexp_k(log_softmax(logits)_k + log N(y; mu_k, Sigma_k))`, with
max-shifted log-sum-exp and log-softmax, so a component far from the target (a
log-density of -1e4) neither underflows nor overflows. The loss `losses.mixture_nll` is
its negative mean; `Mixture` (`_mixture`) reads the same layout in numpy.
"""

from __future__ import annotations

import math
from typing import Any

import array_api_compat

from pipekit_train.core._errors import ConfigError

__all__ = [
    "COVARIANCES",
    "check_layout",
    "check_params",
    "log_softmax",
    "logsumexp",
    "mixture_log_prob",
    "mixture_width",
    "split",
]

#: The covariance parametrisations of `mixture_nll`.
COVARIANCES = ("diag", "full")

_LOG_2PI = math.log(2.0 * math.pi)


def mixture_width(n_components: int, dim: int, covariance: str = "diag") -> int:
    """The size of the network's last output axis for `K` components over `d` values.

    Args:
        n_components: `K`, the number of mixture components.
        dim: `d`, the number of target values.
        covariance: `"diag"` or `"full"` (see the module docstring for the layout).

    Examples:
        >>> from pipekit_train.core.losses import mixture_width
        >>> mixture_width(5, 2), mixture_width(5, 2, "full")
        (25, 30)
    """
    extra = dim * (dim - 1) // 2 if covariance == "full" else 0
    return n_components * (1 + 2 * dim + extra)


def check_params(params: dict[str, Any]) -> None:
    """Validate `mixture_nll`'s parameters (`n_components`, `covariance`)."""
    k = params.get("n_components")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(
            f"`n_components` must be a positive int for `mixture_nll`. Received: "
            f"n_components={k!r}. Pass e.g. mixture_nll(n_components=5)."
        )
    cov = params.get("covariance")
    if cov not in COVARIANCES:
        raise ConfigError(
            f"`covariance` must be one of {list(COVARIANCES)} for `mixture_nll`. Received: "
            f"covariance={cov!r}. Use 'diag' (independent scales) or 'full' (Cholesky factor)."
        )


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in x.shape)


def log_softmax(xp: Any, logits: Any) -> Any:
    """Max-shifted log-softmax over the last axis."""
    shifted = logits - xp.max(logits, axis=-1, keepdims=True)
    return shifted - xp.log(xp.sum(xp.exp(shifted), axis=-1, keepdims=True))


def logsumexp(xp: Any, a: Any) -> Any:
    """Max-shifted `log(sum(exp(a)))` over the last axis."""
    top = xp.max(a, axis=-1, keepdims=True)
    return xp.log(xp.sum(xp.exp(a - top), axis=-1)) + top[..., 0]


def split(
    xp: Any, pred: Any, n_components: int, dim: int, covariance: str
) -> tuple[Any, Any, Any, Any]:
    """`(logits (..., K), means (..., K, d), log_scales (..., K, d), lower (..., K, m) or None)`."""
    k, d = n_components, dim
    lead = _shape(pred)[:-1]
    logits = pred[..., :k]
    means = xp.reshape(pred[..., k : k + k * d], (*lead, k, d))
    log_scales = xp.reshape(pred[..., k + k * d : k + 2 * k * d], (*lead, k, d))
    lower = None
    if covariance == "full":
        m = d * (d - 1) // 2
        lower = xp.reshape(pred[..., k + 2 * k * d :], (*lead, k, m))
    return logits, means, log_scales, lower


def check_layout(pred: Any, target: Any, n_components: int, covariance: str) -> int:
    """Check `pred`'s width against the target's `d` and return `d`."""
    if pred.ndim < 1 or target.ndim != pred.ndim:
        raise ConfigError(
            "`pred` and `target` need the same number of axes for `mixture_nll`, the last "
            f"holding the mixture parameters and the target values. Received: pred.shape={_shape(pred)}, "
            f"target.shape={_shape(target)}. Give the target a trailing axis, e.g. (n, 1)."
        )
    d = int(target.shape[-1])
    width = mixture_width(n_components, d, covariance)
    if _shape(pred)[:-1] != _shape(target)[:-1] or int(pred.shape[-1]) != width:
        raise ConfigError(
            f"`pred` must have shape target.shape[:-1] + ({width},) for `mixture_nll` with "
            f"n_components={n_components}, covariance={covariance!r} and {d} target values. "
            f"Received: pred.shape={_shape(pred)}, target.shape={_shape(target)}. Give the "
            f"model {width} outputs (mixture_width({n_components}, {d}, {covariance!r}))."
        )
    return d


def mixture_log_prob(pred: Any, target: Any, *, n_components: int, covariance: str = "diag") -> Any:
    """The mixture's log-density of `target`, per sample: shape `target.shape[:-1]`.

    `pred` has the layout of the module docstring; any array-API library (numpy, jax,
    torch), differentiable where the library is.
    """
    try:
        xp = array_api_compat.array_namespace(pred)
    except TypeError as exc:
        raise ConfigError(
            "`pred` must be an array (numpy, jax or torch) for `mixture_nll`. "
            f"Received: pred of type {type(pred).__name__}. Pass the model output array."
        ) from exc
    try:
        array_api_compat.array_namespace(pred, target)
    except TypeError:
        target = xp.asarray(target, device=array_api_compat.device(pred))
    if not hasattr(target, "shape"):
        target = xp.asarray(target, device=array_api_compat.device(pred))
    d = check_layout(pred, target, n_components, covariance)
    if target.dtype != pred.dtype and xp.isdtype(pred.dtype, "real floating"):
        target = xp.astype(target, pred.dtype)
    logits, means, log_scales, lower = split(xp, pred, n_components, d, covariance)
    resid = xp.expand_dims(target, axis=-2) - means  # (..., K, d)
    if lower is None:
        z = resid * xp.exp(-log_scales)
        sq = xp.sum(z * z, axis=-1)
    else:
        # Forward substitution L z = resid, one row at a time (d is small).
        inv_diag = xp.exp(-log_scales)
        zs: list[Any] = []
        sq = None
        for i in range(d):
            row = resid[..., i]
            for j in range(i):
                row = row - lower[..., i * (i - 1) // 2 + j] * zs[j]
            zi = row * inv_diag[..., i]
            zs.append(zi)
            sq = zi * zi if sq is None else sq + zi * zi
    comp = -0.5 * sq - xp.sum(log_scales, axis=-1) - 0.5 * d * _LOG_2PI  # (..., K)
    return logsumexp(xp, log_softmax(xp, logits) + comp)
