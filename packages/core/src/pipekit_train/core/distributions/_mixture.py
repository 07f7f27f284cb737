"""`Mixture`: a predicted Gaussian mixture (what a `head="mixture"` model's output means).

A model trained with `losses.mixture_nll(n_components=K, covariance=...)` outputs, per
sample, weight logits, means and a Cholesky factor per component (layout in
`_mixture_math`). `mixture_from_output` decodes that output into a
`Mixture` in numpy, and `NeuralForward(..., head="mixture").distribution(x)` returns it
in the target's original units.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError

from . import _mixture_math as layout

__all__ = ["Mixture", "mixture_dim", "mixture_from_output"]

_LOG_2PI = math.log(2.0 * math.pi)


@dataclass(frozen=True, eq=False)
class Mixture:
    """Gaussian mixtures over `d` values, one per sample: `sum_k w_k N(mu_k, L_k L_k^T)`.

    Arrays are float64 and share the leading (batch) axes `...`.

    Attributes:
        weights: the component weights, `(..., K)`, positive, summing to 1.
        means: the component means, `(..., K, d)`.
        scale_tril: the lower-triangular Cholesky factors, `(..., K, d, d)`: component
            `k`'s covariance is `scale_tril[..., k, :, :] @ scale_tril[..., k, :, :].T`
            (diagonal for a mixture trained with `covariance="diag"`).
    """

    weights: np.ndarray
    means: np.ndarray
    scale_tril: np.ndarray

    def __post_init__(self) -> None:
        for name in ("weights", "means", "scale_tril"):
            object.__setattr__(self, name, np.asarray(getattr(self, name), dtype=np.float64))
        w, m, s = self.weights, self.means, self.scale_tril
        if m.ndim < 2 or w.shape != m.shape[:-1] or s.shape != (*m.shape, m.shape[-1]):
            raise ConfigError(
                "`Mixture` needs weights (..., K), means (..., K, d) and scale_tril "
                f"(..., K, d, d). Received: weights.shape={w.shape}, means.shape={m.shape}, "
                f"scale_tril.shape={s.shape}."
            )

    @property
    def n_components(self) -> int:
        """`K`, the number of components."""
        return int(self.weights.shape[-1])

    @property
    def dim(self) -> int:
        """`d`, the number of values each mixture is over."""
        return int(self.means.shape[-1])

    @property
    def mean(self) -> np.ndarray:
        """The mixture means, `(..., d)`: `sum_k w_k mu_k`."""
        return np.einsum("...k,...kd->...d", self.weights, self.means)

    @property
    def covariances(self) -> np.ndarray:
        """The component covariances `L_k L_k^T`, `(..., K, d, d)`."""
        return self.scale_tril @ np.swapaxes(self.scale_tril, -1, -2)

    def log_prob(self, value: Any) -> np.ndarray:
        """The log-density of `value` `(..., d)` (broadcast against the batch), shape `(...)`.

        With `value` of shape `(n, *batch, d)` each of the `n` draws is scored under the
        batch's mixtures (e.g. the output of `sample(rng, n)`).
        """
        y = np.asarray(value, dtype=np.float64)
        if y.ndim < 1 or y.shape[-1] != self.dim:
            raise ConfigError(
                f"`value` must have the mixture's {self.dim} values on its last axis. "
                f"Received: value.shape={y.shape}."
            )
        resid = y[..., None, :] - self.means  # (..., K, d)
        tril = np.broadcast_to(self.scale_tril, (*resid.shape, self.dim))
        z = _solve_lower(tril, resid)
        diag = np.abs(np.diagonal(tril, axis1=-2, axis2=-1))
        comp = -0.5 * np.sum(z * z, axis=-1) - np.sum(np.log(diag), axis=-1)
        comp = comp - 0.5 * self.dim * _LOG_2PI + np.log(self.weights)
        top = np.max(comp, axis=-1, keepdims=True)
        return np.log(np.sum(np.exp(comp - top), axis=-1)) + top[..., 0]

    def sample(self, rng: np.random.Generator, n: int | None = None) -> np.ndarray:
        """Draw from the mixtures with `rng`: shape `(..., d)`, or `(n, ..., d)`."""
        batch = self.weights.shape[:-1]
        shape = batch if n is None else (int(n), *batch)
        cumulative = np.cumsum(self.weights, axis=-1)
        u = rng.random(shape)[..., None]
        k = np.minimum(np.sum(u > cumulative, axis=-1), self.n_components - 1)  # shape
        eps = rng.standard_normal((*shape, self.dim))
        means = np.broadcast_to(self.means, (*shape, self.n_components, self.dim))
        trils = np.broadcast_to(self.scale_tril, (*shape, self.n_components, self.dim, self.dim))
        idx = k[..., None, None]
        mu = np.take_along_axis(means, idx, axis=-2)[..., 0, :]
        tril = np.take_along_axis(trils, idx[..., None], axis=-3)[..., 0, :, :]
        return mu + np.einsum("...ij,...j->...i", tril, eps)

    @classmethod
    def from_output(cls, out: Any, n_components: int, covariance: str = "diag") -> Mixture:
        """Decode a raw model output `(..., width)` in the `mixture_nll` layout.

        The mixture is in the output's units (normalised units for a model trained with
        a `Normalizer`; `NeuralForward(head="mixture").distribution` converts).

        Raises:
            ConfigError: the width fits no target size for `n_components`/`covariance`.
        """
        return mixture_from_output(out, n_components, covariance)

    def __getitem__(self, index: Any) -> Mixture:
        """The mixtures at `index` of the batch axes (numpy indexing)."""
        return Mixture(self.weights[index], self.means[index], self.scale_tril[index])

    def __len__(self) -> int:
        return len(self.weights)


def _solve_lower(tril: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """Forward substitution `L z = rhs` over the last axis (d is small)."""
    z = np.zeros_like(rhs)
    for i in range(rhs.shape[-1]):
        acc = rhs[..., i] - np.sum(tril[..., i, :i] * z[..., :i], axis=-1)
        z[..., i] = acc / tril[..., i, i]
    return z


def mixture_dim(width: int, n_components: int, covariance: str) -> int | None:
    """The `d` with `mixture_width(n_components, d, covariance) == width`, or None."""
    for d in range(1, 1 + max(1, width)):
        w = layout.mixture_width(n_components, d, covariance)
        if w == width:
            return d
        if w > width:
            return None
    return None


def mixture_from_output(out: Any, n_components: int, covariance: str = "diag") -> Mixture:
    """Decode a model output `(..., width)` (the `mixture_nll` layout) into a `Mixture`.

    Raises:
        ConfigError: the width fits no target size for these `n_components`/`covariance`.
    """
    out = np.asarray(out, dtype=np.float64)
    width = int(out.shape[-1]) if out.ndim else 0
    d = mixture_dim(width, n_components, covariance) if out.ndim >= 1 else None
    if d is None:
        raise ConfigError(
            f"With `head='mixture'`, n_components={n_components} and "
            f"covariance={covariance!r} the model's output width must be "
            f"mixture_width({n_components}, d, {covariance!r}) for some d "
            f"({[layout.mixture_width(n_components, i, covariance) for i in (1, 2, 3)]} for "
            f"d = 1, 2, 3). Received: output shape {out.shape}. Check `n_components` and "
            "`covariance` against the loss the model was trained with."
        )
    import array_api_compat.numpy as xp

    logits, means, log_scales, lower = layout.split(xp, out, n_components, d, covariance)
    weights = np.exp(layout.log_softmax(xp, logits))
    tril = np.zeros((*means.shape, d))
    idx = np.arange(d)
    tril[..., idx, idx] = np.exp(log_scales)
    if lower is not None:
        rows, cols = np.tril_indices(d, -1)
        tril[..., rows, cols] = lower
    return Mixture(np.asarray(weights), np.asarray(means), tril)
