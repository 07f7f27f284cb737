"""Keras layers initialised like torch and Equinox (imports keras only when called)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["dense"]


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
