"""Small model factories for tests, examples and the conformance suite.

```python
from pipekit_train.keras import KerasModelOp

op = KerasModelOp("pipekit_train.keras.testing:linear", in_size=4, out_size=1, seed=0)
```
"""

from __future__ import annotations

from typing import Any

from pipekit_train.core import model_factory

from ._backend import configure

__all__ = ["linear", "mlp"]


@model_factory
def linear(in_size: int, out_size: int) -> Any:
    """A `keras.Model` computing `x @ W + b` (one `Dense` layer)."""
    configure()
    import keras

    return keras.Sequential([keras.Input((in_size,)), keras.layers.Dense(out_size)])


@model_factory
def mlp(in_size: int, out_size: int, width: int = 64, depth: int = 2, dropout: float = 0.0) -> Any:
    """A ReLU MLP `in_size → width × depth → out_size`, with optional dropout (uses RNG)."""
    configure()
    import keras

    layers: list[Any] = [keras.Input((in_size,))]
    for _ in range(depth):
        layers.append(keras.layers.Dense(width, activation="relu"))
        if dropout:
            layers.append(keras.layers.Dropout(dropout))
    layers.append(keras.layers.Dense(out_size))
    return keras.Sequential(layers)
