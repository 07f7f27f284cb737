"""Embedding networks for structured observations: `deep_set` for sets of i.i.d. points.

A DeepSet (Zaheer et al. 2017) reads a set of points `(n_points, point_size)` as
`ρ(pool_i φ(x_i))`: `φ` embeds every point alike, the pool (mean or sum over the points)
forgets their order, and `ρ` maps the pooled embedding to the head's output (a mean and
log-variance for `gaussian_nll`, a mixture for `mixture_nll`), so the output is the same
for every ordering of the points. It trains end to end with the head's loss like any model.

The same architecture, options and initialisation family (torch's default, uniform
`±1/sqrt(fan_in)`) as `deep_set` in `pipekit_train.equinox` and `pipekit_train.keras`:

- `φ`: `depth` hidden layers of `width`, then a layer to `embed_size`, each followed by
  `activation`;
- `ρ`: `depth` hidden layers of `width` with `activation`, then a linear layer to
  `out_size`.
"""

from __future__ import annotations

import torch

from pipekit_train.core.adapter import check_deep_set_options, deep_set_shape_error, model_factory

__all__ = ["DeepSet", "deep_set"]

_ACTIVATIONS = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}


def _stack(sizes: list[int], activation: str, last_activation: bool) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(torch.nn.Linear(fan_in, fan_out))
        if i < len(sizes) - 2 or last_activation:
            layers.append(_ACTIVATIONS[activation]())
    return torch.nn.Sequential(*layers)


class DeepSet(torch.nn.Module):
    """`ρ(pool_i φ(x_i))` on a batch of sets `(batch, n_points, point_size)`.

    Args:
        point_size: the values of one point.
        out_size: the output width.
        embed_size: the width of the pooled embedding.
        width: the hidden width of `φ` and `ρ`.
        depth: hidden layers in each of `φ` and `ρ`.
        pooling: `"mean"` or `"sum"`.
        activation: `"relu"` or `"tanh"`.
    """

    def __init__(
        self,
        point_size: int,
        out_size: int,
        embed_size: int,
        width: int,
        depth: int,
        pooling: str,
        activation: str,
    ) -> None:
        super().__init__()
        self.point_size = point_size
        self.pooling = pooling
        hidden = [width] * depth
        self.phi = _stack([point_size, *hidden, embed_size], activation, last_activation=True)
        self.rho = _stack([embed_size, *hidden, out_size], activation, last_activation=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The output `(batch, out_size)` of a batch of sets."""
        if x.ndim != 3 or x.shape[-1] != self.point_size:
            raise deep_set_shape_error(self.point_size, tuple(x.shape[1:]))
        embedded = self.phi(x)
        pooled = embedded.mean(dim=1) if self.pooling == "mean" else embedded.sum(dim=1)
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
) -> DeepSet:
    """A DeepSet on sets of points `(batch, n_points, point_size)` → `(batch, out_size)`.

    ```python
    op = TorchModelOp("pipekit_train.lightning:deep_set", point_size=2, out_size=4)
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
    return DeepSet(point_size, out_size, embed_size, width, depth, pooling, activation)
