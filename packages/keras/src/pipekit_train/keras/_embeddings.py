"""Embedding networks for structured observations: `deep_set` for sets of i.i.d. points.

A DeepSet (Zaheer et al. 2017) reads a set of points `(n_points, point_size)` as
`ρ(pool_i φ(x_i))`: `φ` embeds every point alike, the pool (mean or sum over the points)
forgets their order, and `ρ` maps the pooled embedding to the head's output (a mean and
log-variance for `gaussian_nll`, a mixture for `mixture_nll`), so the output is the same
for every ordering of the points. It trains end to end with the head's loss like any model.

The same architecture, options and initialisation family (uniform `±1/sqrt(fan_in)`, see
`pipekit_train.keras.testing.dense`) as `deep_set` in `pipekit_train.equinox` and
`pipekit_train.lightning`:

- `φ`: `depth` hidden layers of `width`, then a layer to `embed_size`, each followed by
  `activation` (`Dense` layers act on the last axis: every point alike);
- `ρ`: `depth` hidden layers of `width` with `activation`, then a linear layer to
  `out_size`.

The model's input is `(None, point_size)` per sample: sets of any size. Importing this
module does not import keras (the factory does).
"""

from __future__ import annotations

from typing import Any

from pipekit_train.core.adapter import check_deep_set_options, model_factory

from ._keras_backend import configure

__all__ = ["deep_set"]


@model_factory
def deep_set(
    point_size: int,
    out_size: int,
    embed_size: int = 64,
    width: int = 64,
    depth: int = 2,
    pooling: str = "mean",
    activation: str = "relu",
) -> Any:
    """A DeepSet `keras.Model` on sets of points `(batch, n_points, point_size)`.

    ```python
    op = KerasModelOp("pipekit_train.keras:deep_set", point_size=2, out_size=4, seed=0)
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
    configure()
    import keras

    from ._layers import dense

    inputs = keras.Input((None, point_size))
    h, fan_in = inputs, point_size
    for _ in range(depth):
        h, fan_in = dense(width, fan_in, activation)(h), width
    h = dense(embed_size, fan_in, activation)(h)
    pooled = keras.ops.mean(h, axis=1) if pooling == "mean" else keras.ops.sum(h, axis=1)
    h, fan_in = pooled, embed_size
    for _ in range(depth):
        h, fan_in = dense(width, fan_in, activation)(h), width
    return keras.Model(inputs, dense(out_size, fan_in)(h), name="deep_set")
