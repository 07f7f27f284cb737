"""Keras layers initialised like torch and Equinox (imports keras only when called).

One `dense` for the library (`deep_set`) and the testing models: the kernel and bias are
uniform in `±1/sqrt(fan_in)`. The testing models draw them with `flat_random_uniform`,
the same values as Keras's `RandomUniform` drawn faster; the library's layers keep
`RandomUniform` itself, so a saved model needs nothing of this package to load.
"""

from __future__ import annotations

import functools
import math
from typing import Any

__all__ = ["dense", "flat_random_uniform"]


def dense(units: int, fan_in: int, activation: str | None = None, *, uniform: Any = None) -> Any:
    """A `Dense` layer initialised like torch and Equinox: uniform `±1/sqrt(fan_in)`.

    Keras's default (Glorot-uniform kernel, zero bias) is another family; this one keeps a
    model's starting point comparable across backends.

    Args:
        units: the output width.
        fan_in: the input width (sets the bound).
        activation: the layer's activation, or None.
        uniform: the initializer class drawing the values (None: Keras's
            `RandomUniform`; `flat_random_uniform()` draws the same values faster).
    """
    import keras

    uniform = keras.initializers.RandomUniform if uniform is None else uniform
    bound = 1.0 / math.sqrt(fan_in)
    return keras.layers.Dense(
        units,
        activation=activation,
        kernel_initializer=uniform(-bound, bound),
        bias_initializer=uniform(-bound, bound),
    )


@functools.cache
def flat_random_uniform() -> Any:
    """`keras.initializers.RandomUniform`, drawing a tensor's numbers in a row, then reshaping.

    The values are `RandomUniform`'s own: jax and torch number a draw's elements in
    row-major order. On jax each new shape costs a compiled threefry program on a CPU
    (0.2-0.3 s; 0.8-1.5 s for a rank-4 kernel), and with jax's partitionable threefry (the
    default) element `i` of a draw depends on the key and `i` alone, so this draws the next
    power of two and keeps the first numbers (cut on the host): one compiled draw per
    power of two. `test_conv2d_holds_random_uniform_values` and
    `test_dense_holds_random_uniform_values` check the values.
    """
    import keras

    # registered under its first home's name, so a saved model config still resolves it
    @keras.saving.register_keras_serializable(package="pipekit_train.keras.testing")
    class FlatRandomUniform(keras.initializers.RandomUniform):
        def __call__(self, shape: Any, dtype: Any = None) -> Any:
            n = math.prod(shape)
            if keras.backend.backend() == "jax":
                import jax

                if jax.config.jax_threefry_partitionable:  # type: ignore[attr-defined]  # set at run time
                    size = max(256, 1 << (n - 1).bit_length())
                    flat = super().__call__((size,), dtype)
                    if isinstance(flat, jax.core.Tracer):  # drawn inside a traced function
                        return keras.ops.reshape(flat[:n], shape)
                    cut = keras.ops.convert_to_numpy(flat)[:n].reshape(shape)
                    return keras.ops.convert_to_tensor(cut)
            return keras.ops.reshape(super().__call__((n,), dtype), shape)

    return FlatRandomUniform
