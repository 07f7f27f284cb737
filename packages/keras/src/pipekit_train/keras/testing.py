"""Small model factories for tests, examples and the conformance suite.

```python
from pipekit_train.keras import KerasModelOp

op = KerasModelOp("pipekit_train.keras.testing:linear", in_size=4, out_size=1, seed=0)
```
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipekit_train.core import model_factory

from . import _layers
from ._keras_backend import configure
from ._layers import flat_random_uniform

__all__ = [
    "channels_first_conv",
    "conv2d",
    "conv_from_weights",
    "conv_net",
    "dense",
    "golden_backend",
    "linear",
    "mlp",
    "mlp_from_weights",
    "mlp_weights",
    "periodic_pad",
]


def dense(units: int, fan_in: int, activation: str | None = None) -> Any:
    """A `Dense` layer initialised like torch and Equinox: uniform `±1/sqrt(fan_in)`.

    The package's one `dense` (`_layers.dense`, `deep_set`'s layer too) with its values
    drawn by `flat_random_uniform`: `RandomUniform`'s own values, on jax drawn at a
    power-of-two length and cut, one compiled draw per length rather than per shape, as
    `conv2d`'s are (`test_dense_holds_random_uniform_values` checks them).
    """
    return _layers.dense(units, fan_in, activation, uniform=flat_random_uniform())


@model_factory
def linear(in_size: int, out_size: int) -> Any:
    """A `keras.Model` computing `x @ W + b` (one `Dense` layer)."""
    configure()
    import keras

    return keras.Sequential([keras.Input((in_size,)), dense(out_size, in_size)])


@model_factory
def mlp(
    in_size: int,
    out_size: int,
    width: int = 32,
    depth: int = 1,
    activation: str = "tanh",
    dropout: float = 0.0,
    batch_norm: bool = False,
) -> Any:
    """An MLP: `depth` hidden layers of `width` with `activation`, optional dropout.

    `batch_norm` puts a `BatchNormalization` before each hidden activation.

    The same architecture and initialisation family (uniform `±1/sqrt(fan_in)`, see
    `dense`) as `mlp` in `pipekit_train.equinox.testing` and `pipekit_train.lightning.testing`.
    """
    configure()
    import keras

    layers: list[Any] = [keras.Input((in_size,))]
    size = in_size
    for _ in range(depth):
        if batch_norm:
            layers += [dense(width, size), keras.layers.BatchNormalization()]
            layers.append(keras.layers.Activation(activation))
        else:
            layers.append(dense(width, size, activation))
        if dropout:
            layers.append(keras.layers.Dropout(dropout))
        size = width
    layers.append(dense(out_size, size))
    return keras.Sequential(layers)


@functools.cache
def _periodic_pad_class() -> Any:
    import keras

    class PeriodicPad2D(keras.layers.Layer):
        """Pad a channels-last batch `(N, H, W, C)` periodically by `pad` cells on each side."""

        def __init__(self, pad: int, **kwargs: Any):
            super().__init__(**kwargs)
            self.pad = int(pad)

        def call(self, x: Any) -> Any:
            p, ops = self.pad, keras.ops
            if not p:
                return x
            x = ops.concatenate([x[:, -p:], x, x[:, :p]], axis=1)
            return ops.concatenate([x[:, :, -p:], x, x[:, :, :p]], axis=2)

        def compute_output_shape(self, shape: Any) -> Any:
            n, h, w, c = shape
            h = None if h is None else h + 2 * self.pad
            w = None if w is None else w + 2 * self.pad
            return (n, h, w, c)

        def get_config(self) -> dict[str, Any]:
            return {**super().get_config(), "pad": self.pad}

    return PeriodicPad2D


def periodic_pad(pad: int) -> Any:
    """A Keras layer padding channels-last fields `(N, H, W, C)` periodically by `pad` per side."""
    return _periodic_pad_class()(pad)


def conv2d(filters: int, in_channels: int, kernel_size: int, activation: str | None = None) -> Any:
    """A `valid` `Conv2D` initialised like torch and Equinox: uniform `±1/sqrt(fan_in)`.

    `fan_in = in_channels * kernel_size**2`, for the kernel and the bias.
    """
    import keras

    bound = 1.0 / math.sqrt(in_channels * kernel_size * kernel_size)
    uniform = flat_random_uniform()
    return keras.layers.Conv2D(
        filters,
        kernel_size,
        padding="valid",
        activation=activation,
        data_format="channels_last",
        kernel_initializer=uniform(-bound, bound),
        bias_initializer=uniform(-bound, bound),
    )


@model_factory
def conv_net(
    in_channels: int,
    out_channels: int,
    width: int = 16,
    depth: int = 2,
    kernel_size: int = 3,
    activation: str = "tanh",
) -> Any:
    """A periodic conv net on channels-last fields `(N, H, W, C_in) -> (N, H, W, C_out)`.

    `depth` hidden convolutions of `width` with `activation`; each convolution is a
    periodic pad (`periodic_pad`) and a `valid` `Conv2D`, so the output keeps the grid.
    Any grid size is accepted (`Input((None, None, in_channels))`). The same architecture
    and initialisation family as `conv_net` in `pipekit_train.equinox.testing` and
    `pipekit_train.lightning.testing`.
    """
    configure()
    import keras

    sizes = [in_channels] + [width] * depth + [out_channels]
    layers: list[Any] = [keras.Input((None, None, in_channels))]
    for i, (c_in, c_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(periodic_pad(kernel_size // 2))
        act = activation if i < len(sizes) - 2 else None
        layers.append(conv2d(c_out, c_in, kernel_size, act))
    return keras.Sequential(layers)


@model_factory
def channels_first_conv(
    in_channels: int, out_channels: int, width: int = 8, kernel_size: int = 3
) -> Any:
    """A conv net on channels-first 1-D fields `(N, C_in, L) -> (N, C_out, L)`.

    Two `Conv1D(data_format="channels_first", padding="same")` with a tanh between them,
    any length (`Input((in_channels, None))`): train it on channels-last data with
    `KerasModelOp(..., layout="channels_last")`.
    """
    configure()
    import keras

    conv = {"padding": "same", "data_format": "channels_first"}
    return keras.Sequential(
        [
            keras.Input((in_channels, None)),
            keras.layers.Conv1D(width, kernel_size, activation="tanh", **conv),
            keras.layers.Conv1D(out_channels, kernel_size, **conv),
        ]
    )


def conv_from_weights(weights: Sequence[np.ndarray], activation: str = "tanh") -> Any:
    """A `KerasModelOp` of `conv_net` holding canonical conv weights `[K0, b0, ...]`.

    `K` has shape `(kh, kw, c_in, c_out)`, Keras's own kernel layout.
    """
    import keras
    from pipekit_train.core.testing import conv_sizes
    from pipekit_train.keras import KerasModelOp

    op = KerasModelOp(
        "pipekit_train.keras.testing:conv_net", activation=activation, **conv_sizes(weights)
    )
    layers = [la for la in op.model.layers if isinstance(la, keras.layers.Conv2D)]
    for i, layer in enumerate(layers):
        layer.set_weights([weights[2 * i], weights[2 * i + 1]])
    return op


def mlp_from_weights(weights: Sequence[np.ndarray], activation: str = "tanh") -> Any:
    """A `KerasModelOp` of `mlp` holding canonical weights `[W0, b0, W1, b1, ...]`.

    `W` has shape `(fan_in, fan_out)`, Keras's own kernel layout.
    """
    import keras
    from pipekit_train.core.testing import mlp_sizes
    from pipekit_train.keras import KerasModelOp

    op = KerasModelOp(
        "pipekit_train.keras.testing:mlp", activation=activation, **mlp_sizes(weights)
    )
    layers = [la for la in op.model.layers if isinstance(la, keras.layers.Dense)]
    for i, layer in enumerate(layers):
        layer.set_weights([weights[2 * i], weights[2 * i + 1]])
    return op


def mlp_weights(op: Any) -> list[np.ndarray]:
    """The canonical weights `[W0, b0, W1, b1, ...]` of an `mlp` operator (Keras's layout)."""
    import keras

    out: list[np.ndarray] = []
    for layer in (la for la in op.model.layers if isinstance(la, keras.layers.Dense)):
        out += [np.asarray(w) for w in layer.get_weights()]
    return out


def golden_backend() -> Any:
    """The Keras backend of the cross-backend golden-run suite (named by Keras's backend)."""
    from pipekit_train.core.testing import GoldenBackend
    from pipekit_train.keras import Keras

    from ._keras_backend import backend_name

    return GoldenBackend(
        name=f"keras-{backend_name()}",
        model_from_weights=mlp_from_weights,
        adapter=lambda p: Keras(precision=p),
        conv_from_weights=conv_from_weights,
        weights_of=mlp_weights,
    )
