"""Embedding networks for structured observations: `deep_set` for sets of i.i.d. points.

A DeepSet (Zaheer et al. 2017) reads a set of points `(n_points, point_size)` as
`ρ(pool_i φ(x_i))`: `φ` embeds every point alike, the pool (mean or sum over the points)
forgets their order, and `ρ` maps the pooled embedding to the head's output (a mean and
log-variance for `gaussian_nll`, a mixture for `mixture_nll`), so the output is the same
for every ordering of the points. It trains end to end with the head's loss like any model.

The same architecture, options and initialisation family (uniform `±1/sqrt(fan_in)`) as
`deep_set` in `pipekit_train.lightning` and `pipekit_train.keras`:

- `φ`: `depth` hidden layers of `width`, then a layer to `embed_size`, each followed by
  `activation`;
- `ρ`: `depth` hidden layers of `width` with `activation`, then a linear layer to
  `out_size`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

import equinox as eqx
from pipekit_train.core.adapter import check_deep_set_options, deep_set_shape_error, model_factory

__all__ = ["DeepSet", "deep_set"]

_ACTIVATIONS = {"tanh": jax.nn.tanh, "relu": jax.nn.relu}


class DeepSet(eqx.Module):
    """`ρ(pool_i φ(x_i))` on one set `(n_points, point_size)` (the adapter vmaps it).

    Attributes:
        phi: the per-point embedding.
        rho: the map from the pooled embedding to the output.
        point_size: the values of one point.
        pooling: `"mean"` or `"sum"`.
    """

    phi: eqx.nn.MLP
    rho: eqx.nn.MLP
    point_size: int = eqx.field(static=True)
    pooling: str = eqx.field(static=True)

    def __call__(self, x: Float[Array, "n_points point_size"]) -> Float[Array, " out"]:
        if x.ndim != 2 or x.shape[-1] != self.point_size:
            raise deep_set_shape_error(self.point_size, tuple(x.shape))
        embedded = jax.vmap(self.phi)(x)
        pooled = jnp.mean(embedded, axis=0) if self.pooling == "mean" else embedded.sum(0)
        return self.rho(pooled)


@model_factory
def deep_set(
    point_size: int,
    out_size: int,
    embed_size: int = 64,
    width: int = 64,
    depth: int = 2,
    pooling: str = "mean",
    activation: str = "relu",
    *,
    key: PRNGKeyArray,
) -> DeepSet:
    """A DeepSet on one set of points `(n_points, point_size)` → `(out_size,)`.

    ```python
    op = EquinoxModelOp("pipekit_train.equinox:deep_set", point_size=2, out_size=4, seed=0)
    ```

    Args:
        point_size: the values of one point.
        out_size: the output width (the head's: `2 * D` for `gaussian_nll`,
            `losses.mixture_width(K, D, covariance)` for `mixture_nll`).
        embed_size: the width of the pooled embedding.
        width: the hidden width of `φ` and `ρ`.
        depth: hidden layers in each of `φ` and `ρ`.
        pooling: `"mean"` (the set size does not change the scale) or `"sum"`.
        activation: `"relu"` or `"tanh"`.
        key: the initialisation key.

    Raises:
        ConfigError: a size below 1, a negative depth, an unknown pooling or activation.
    """
    check_deep_set_options(
        point_size=point_size,
        out_size=out_size,
        embed_size=embed_size,
        width=width,
        depth=depth,
        pooling=pooling,
        activation=activation,
    )
    act = _ACTIVATIONS[activation]
    k_phi, k_rho = jax.random.split(key)
    phi = eqx.nn.MLP(
        point_size, embed_size, width, depth, activation=act, final_activation=act, key=k_phi
    )
    rho = eqx.nn.MLP(embed_size, out_size, width, depth, activation=act, key=k_rho)
    return DeepSet(phi, rho, point_size, pooling)
