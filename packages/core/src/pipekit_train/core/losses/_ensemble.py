"""Proper scores of ensembles and of a Gaussian head, written once against the array API.

An *ensemble loss* scores `M` members per sample against one truth:
`pred` has the members on axis 1, `(B, M, *value)`, and `target` is `(B, *value)`. The
rollout training (`TrainingLoop(rollout=...)` with one of these losses) builds the
members itself: each sample's state is repeated `M` times, each member gets its own
noise (`noise_dim` channels appended to the model's input, drawn in core's feed), and
the `M` predictions are scored together. See `pipekit_train.core.Rollout`.

- `crps`: the CRPS of the ensemble per value, averaged over values and samples. With
  `alpha=1` (the default) it is the *fair* CRPS, whose expectation does not depend on
  `M` (the spread term is divided by `M(M - 1)`); `alpha < 1` is the *almost fair*
  CRPS, `alpha * fair + (1 - alpha) * standard`, the form anemoi's AIFS-CRPS trains
  with at `alpha = 0.95` (the standard CRPS divides by `M²`; `alpha = 0` is it).
- `energy_score`: the fair energy score of the whole sample (every value of one sample
  as one vector): `mean_i ||x_i - y|| - sum_{i != j} ||x_i - x_j|| / (2 M (M - 1))`,
  averaged over samples. It scores the joint distribution (correlations between values
  count), at the price of a weaker signal per value; it grows like the square root of
  the number of values.
- `gaussian_crps`: the CRPS of a Gaussian head's prediction (mean and log-variance, the
  layout `gaussian_nll` trains) in closed form, per value and averaged:
  `sigma * (z * erf(z / sqrt(2)) + 2 phi(z) - 1 / sqrt(pi))`, `z = (y - mu) / sigma`.
  The array API has no `erf`; it is computed with Abramowitz & Stegun's 7.1.26
  (absolute error below 1.5e-7), the same arithmetic on every backend. It trains a
  Gaussian head by the CRPS instead of the likelihood (it needs no members).
- `mixture_crps`: the CRPS of a mixture head's prediction (the layout `mixture_nll`
  trains), per value and averaged, in closed form: each value's marginal is a univariate
  mixture of Gaussians (the same weights; with `covariance="full"` the variances are the
  rows' squared Cholesky norms), whose CRPS is
  `sum_k w_k A(y - mu_k, s_k²) - 1/2 sum_kl w_k w_l A(mu_k - mu_l, s_k² + s_l²)`,
  `A(m, v) = 2 sqrt(v) phi(m / sqrt(v)) + m erf(m / sqrt(2 v))` (Grimit et al. 2006).

The spread term sums each unordered pair of members once, `M - 1` array operations of
`O(M)` each: members are few (4 to 16). The diagonal (`|x_i - x_i|`) is left out rather
than computed as zero: under XLA's fusion a recomputed `x_i - x_i` need not be exactly 0,
and `abs`'s derivative there (+1 in jax) then leaks into the gradient (measured: 1e-3
relative against the same loss without `jit`); the energy score's `sqrt` would have an
infinite derivative there.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.distributions import _mixture_math as mixture

from ._compose import Loss, register
from ._losses import _namespace

__all__ = [
    "ENSEMBLE_LOSSES",
    "check_ensemble_params",
    "crps",
    "energy_score",
    "ensemble_params",
    "erf",
    "gaussian_crps",
    "mixture_crps",
]

#: The losses that score `members` predictions per sample (`pred` is `(B, M, ...)`).
ENSEMBLE_LOSSES = ("crps", "energy_score")

_SQRT_PI = math.sqrt(math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
# Abramowitz & Stegun 7.1.26
_P = 0.3275911
_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def erf(xp: Any, x: Any) -> Any:
    """The error function of `x` in array namespace `xp` (A&S 7.1.26, |error| < 1.5e-7)."""
    a = xp.abs(x)
    t = 1.0 / (1.0 + _P * a)
    poly = t * (_A[0] + t * (_A[1] + t * (_A[2] + t * (_A[3] + t * _A[4]))))
    y = 1.0 - poly * xp.exp(-a * a)
    return xp.where(x < 0, -y, y)


def _members(name: str, pred: Any, target: Any) -> tuple[Any, Any, Any, int]:
    xp, pred, target = _namespace(pred, target)
    pshape = tuple(int(d) for d in pred.shape)
    tshape = tuple(int(d) for d in target.shape)
    if len(pshape) != len(tshape) + 1 or pshape[:1] + pshape[2:] != tshape:
        raise ConfigError(
            f"`{name}` scores an ensemble: `pred` must be `(B, M, *value)` for a target "
            f"`(B, *value)`. Received: pred.shape={pshape}, target.shape={tshape}. Train it "
            "through rollout training (TrainingLoop(rollout=Rollout(...))), which builds the "
            "members."
        )
    if pshape[1] < 2:
        raise ConfigError(
            f"`{name}` needs at least two members per sample. Received: pred.shape={pshape} "
            f"(M={pshape[1]}). Use members >= 2."
        )
    if target.dtype != pred.dtype:
        target = xp.astype(target, pred.dtype)
    return xp, pred, target, pshape[1]


def _crps(
    pred: Any, target: Any, *, members: int = 4, noise_dim: Any = None, alpha: float = 1.0
) -> Any:
    """The (almost) fair CRPS of `M` members per value, averaged (see the module).

    Args:
        pred: the members `(B, M, *value)`.
        target: the truth `(B, *value)`.
        members: the members per sample the rollout training builds (the loss reads
            `M` from `pred`).
        noise_dim: the noise channels appended to the model's input (for the training).
        alpha: 1 for the fair CRPS, in `[0, 1)` for the almost fair one.
    """
    xp, pred, target, m = _members("crps", pred, target)
    skill = xp.mean(xp.abs(pred - xp.expand_dims(target, axis=1)), axis=1)
    pairs = 0.0
    for i in range(1, m):  # each unordered pair once: sum_{j<i} |x_i - x_j|, no diagonal
        pairs = pairs + xp.sum(xp.abs(pred[:, i : i + 1, ...] - pred[:, :i, ...]), axis=1)
    pairs = 2.0 * pairs
    coefficient = (1.0 - (1.0 - float(alpha)) / m) / (2.0 * m * (m - 1))
    return xp.mean(skill - coefficient * pairs)


def _energy_score(pred: Any, target: Any, *, members: int = 4, noise_dim: Any = None) -> Any:
    """The fair energy score of `M` members per sample, averaged over samples (see the module)."""
    xp, pred, target, m = _members("energy_score", pred, target)
    b = int(pred.shape[0])
    flat = xp.reshape(pred, (b, m, -1))
    truth = xp.reshape(target, (b, 1, -1))
    skill = xp.mean(xp.sqrt(xp.sum((flat - truth) ** 2, axis=-1)), axis=1)
    spread = 0.0
    for i in range(1, m):  # each unordered pair once, no diagonal (see the module)
        diff = flat[:, i : i + 1, :] - flat[:, :i, :]
        spread = spread + xp.sum(xp.sqrt(xp.sum(diff * diff, axis=-1)), axis=1)
    spread = spread / (m * (m - 1))
    return xp.mean(skill - spread)


def _gaussian_crps(pred: Any, target: Any) -> Any:
    """The closed-form CRPS of a Gaussian head (`pred[..., :k]` mean, `pred[..., k:]`
    log-variance), per value and averaged (see the module)."""
    xp, pred, target = _namespace(pred, target)
    width = int(pred.shape[-1]) if pred.ndim else 0
    if pred.ndim < 1 or width % 2:
        raise ConfigError(
            "`pred` must have an even-sized last axis for `gaussian_crps`: its first half is "
            f"the mean, its second half the log-variance. Received: pred.shape="
            f"{tuple(int(d) for d in pred.shape)}. Give the model 2*k outputs for k targets."
        )
    mean, log_var = pred[..., : width // 2], pred[..., width // 2 :]
    if tuple(mean.shape) != tuple(target.shape):
        raise ConfigError(
            "The mean and `target` must have the same shape for `gaussian_crps`. Received: "
            f"mean shape {tuple(int(d) for d in mean.shape)}, target.shape="
            f"{tuple(int(d) for d in target.shape)}."
        )
    if target.dtype != pred.dtype:
        target = xp.astype(target, pred.dtype)
    sigma = xp.exp(0.5 * log_var)
    z = (target - mean) / sigma
    density = _INV_SQRT_2PI * xp.exp(-0.5 * z * z)
    score = sigma * (z * erf(xp, z * _INV_SQRT_2) + 2.0 * density - 1.0 / _SQRT_PI)
    return xp.mean(score)


def _normal_a(xp: Any, m: Any, variance: Any) -> Any:
    """`E|X|` for `X ~ N(m, variance)`: `2 s phi(m / s) + m erf(m / (s sqrt 2))`."""
    sd = xp.sqrt(variance)
    z = m / sd
    return 2.0 * sd * _INV_SQRT_2PI * xp.exp(-0.5 * z * z) + m * erf(xp, z * _INV_SQRT_2)


def _mixture_crps(
    pred: Any, target: Any, *, n_components: int = 1, covariance: str = "diag"
) -> Any:
    """The closed-form CRPS of a mixture head per value, averaged (see the module)."""
    xp, pred, target = _namespace(pred, target)
    d = mixture.check_layout(pred, target, n_components, covariance)
    if target.dtype != pred.dtype:
        target = xp.astype(target, pred.dtype)
    logits, means, log_scales, lower = mixture.split(xp, pred, n_components, d, covariance)
    weights = xp.exp(mixture.log_softmax(xp, logits))  # (..., K)
    variance = xp.exp(2.0 * log_scales)  # (..., K, d): the marginal variances
    if lower is not None:  # value i's variance: the squared norm of the Cholesky row i
        rows = [variance[..., 0]]
        for i in range(1, d):
            row = variance[..., i]
            for j in range(i):
                row = row + lower[..., i * (i - 1) // 2 + j] ** 2
            rows.append(row)
        variance = xp.stack(rows, axis=-1)
    w = xp.expand_dims(weights, axis=-1)  # (..., K, 1)
    skill = xp.sum(w * _normal_a(xp, xp.expand_dims(target, axis=-2) - means, variance), axis=-2)
    pair_w = xp.expand_dims(w, axis=-3) * xp.expand_dims(w, axis=-2)  # (..., K, K, 1)
    pair_m = xp.expand_dims(means, axis=-3) - xp.expand_dims(means, axis=-2)
    pair_v = xp.expand_dims(variance, axis=-3) + xp.expand_dims(variance, axis=-2)
    spread = xp.sum(pair_w * _normal_a(xp, pair_m, pair_v), axis=(-3, -2))
    return xp.mean(skill - 0.5 * spread)


def _positive_int(name: str, field: str, value: Any, minimum: int, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ConfigError(
            f"`{field}` must be an int >= {minimum} for `{name}`. Received: {field}={value!r}. "
            f"{fix}"
        )


def check_ensemble_params(name: str, params: dict[str, Any]) -> None:
    """Validate an ensemble loss's parameters (`noise_dim=None` passes: it is required
    when a run trains with the loss, `ensemble_params`)."""
    _positive_int(
        name,
        "members",
        params.get("members"),
        2,
        "A CRPS compares members with each other, so it needs M >= 2 (4 to 16 is usual).",
    )
    if params.get("noise_dim") is not None:
        _positive_int(
            name,
            "noise_dim",
            params["noise_dim"],
            1,
            "Pass the number of noise channels the model takes after the state's.",
        )
    if "alpha" in params:
        alpha = params["alpha"]
        if (
            isinstance(alpha, bool)
            or not isinstance(alpha, numbers.Real)
            or not 0.0 <= float(alpha) <= 1.0
        ):
            raise ConfigError(
                f"`alpha` must be a number in [0, 1] for `{name}`. Received: alpha={alpha!r}. "
                "Use 1 for the fair CRPS, 0.95 for the almost fair one."
            )


def ensemble_params(loss: Any) -> tuple[int, int] | None:
    """`(members, noise_dim)` of a plan's loss description when it is an ensemble loss,
    else None.

    Raises:
        ConfigError: an ensemble loss without `noise_dim`.
    """
    if not isinstance(loss, dict) or loss.get("name") not in ENSEMBLE_LOSSES:
        return None
    params = loss.get("params") or {}
    noise_dim = params.get("noise_dim")
    if noise_dim is None:
        name = loss["name"]
        raise ConfigError(
            f"`{name}` trains a generative model of (state, noise): it needs the width of "
            f"the noise the model takes. Received: loss={name!r} without noise_dim. Pass "
            f"loss=losses.{name}(members=8, noise_dim=w) with a model whose input has the "
            "state's channels plus w."
        )
    return int(params.get("members", 4)), int(noise_dim)


crps: Loss = register(
    "crps",
    Loss(
        _crps,
        params={"members": 4, "noise_dim": None, "alpha": 1.0},
        check=lambda params: check_ensemble_params("crps", params),
    ),
)
"""The fair CRPS of an ensemble (`alpha=1`), or the almost fair one (`alpha < 1`);
`crps(members=8, noise_dim=4)` trains a generative emulator of (state, 4 noise channels)
with 8 members per sample (see the module)."""

energy_score: Loss = register(
    "energy_score",
    Loss(
        _energy_score,
        params={"members": 4, "noise_dim": None},
        check=lambda params: check_ensemble_params("energy_score", params),
    ),
)
"""The fair energy score of an ensemble (multivariate: each sample as one vector)."""

gaussian_crps: Loss = register("gaussian_crps", _gaussian_crps)
"""The closed-form CRPS of a Gaussian head (mean and log-variance outputs)."""

mixture_crps: Loss = register(
    "mixture_crps",
    Loss(
        _mixture_crps,
        params={"n_components": 1, "covariance": "diag"},
        check=mixture.check_params,
    ),
)
"""The closed-form CRPS of a mixture head (the `mixture_nll` layout), per value;
`mixture_crps(n_components=5)` or `covariance="full"`."""
