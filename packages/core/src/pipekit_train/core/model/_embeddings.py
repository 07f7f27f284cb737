"""Embedding networks, the part every backend shares: the DeepSet's options, checked once.

Each adapter package builds `deep_set` in its framework (`pipekit_train.equinox:deep_set`,
`pipekit_train.lightning:deep_set`, `pipekit_train.keras:deep_set`): one architecture, one
initialisation family, and these checks, so a bad option fails the same way everywhere.
"""

from __future__ import annotations

from typing import Any

from pipekit_train.core._checks import is_int
from pipekit_train.core._errors import ConfigError

__all__ = [
    "DEEP_SET_ACTIVATIONS",
    "DEEP_SET_POOLS",
    "check_deep_set_options",
    "set_shape_error",
]

#: The activations a DeepSet takes.
DEEP_SET_ACTIVATIONS = ("relu", "tanh")
#: How a DeepSet pools the embedded points.
DEEP_SET_POOLS = ("mean", "sum")


def check_deep_set_options(
    *,
    point_size: Any,
    out_size: Any,
    embed_size: Any,
    width: Any,
    depth: Any,
    pooling: Any,
    activation: Any,
) -> None:
    """Refuse options a DeepSet cannot take.

    Raises:
        ConfigError: a size below 1, a negative depth, an unknown pooling or activation.
    """
    for name, value, low in (
        ("point_size", point_size, 1),
        ("out_size", out_size, 1),
        ("embed_size", embed_size, 1),
        ("width", width, 1),
        ("depth", depth, 0),
    ):
        if not is_int(value) or value < low:
            raise ConfigError(f"`{name}` must be an int >= {low}. Received: {name}={value!r}.")
    if pooling not in DEEP_SET_POOLS:
        raise ConfigError(
            f"`pooling` must be one of {list(DEEP_SET_POOLS)}. Received: pooling={pooling!r}."
        )
    if activation not in DEEP_SET_ACTIVATIONS:
        raise ConfigError(
            f"`activation` must be one of {list(DEEP_SET_ACTIVATIONS)}. Received: "
            f"activation={activation!r}."
        )


def set_shape_error(point_size: int, shape: tuple[int, ...]) -> ConfigError:
    """The error for a sample that is not one set of points `(n_points, point_size)`."""
    return ConfigError(
        f"`deep_set` takes one set of points (n_points, {point_size}) per sample. Received: "
        f"a sample of shape {shape}. Shape the data as (num_samples, n_points, {point_size}), "
        "or build the DeepSet with the point_size of the data."
    )
