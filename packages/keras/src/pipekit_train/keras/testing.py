"""Small model factories for tests, examples and the conformance suite.

```python
from pipekit_train.keras import KerasModelOp

op = KerasModelOp("pipekit_train.keras.testing:linear", in_size=4, out_size=1, seed=0)
```
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipekit_train.core import model_factory

from ._backend import configure

__all__ = ["dense", "golden_backend", "linear", "mlp", "mlp_from_weights"]


def dense(units: int, fan_in: int, activation: str | None = None) -> Any:
    """A `Dense` layer initialised like torch and Equinox: uniform `±1/sqrt(fan_in)`.

    Keras's default (Glorot-uniform kernel, zero bias) is another family; this one keeps a
    model's starting point comparable across backends.
    """
    import keras

    bound = 1.0 / math.sqrt(fan_in)
    return keras.layers.Dense(
        units,
        activation=activation,
        kernel_initializer=keras.initializers.RandomUniform(-bound, bound),
        bias_initializer=keras.initializers.RandomUniform(-bound, bound),
    )


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


def golden_backend() -> Any:
    """The Keras backend of the cross-backend golden-run suite (named by Keras's backend)."""
    from pipekit_train.core.testing import GoldenBackend
    from pipekit_train.keras import Keras

    from ._backend import backend_name

    return GoldenBackend(
        name=f"keras-{backend_name()}",
        model_from_weights=mlp_from_weights,
        adapter=lambda p: Keras(precision=p),
    )
