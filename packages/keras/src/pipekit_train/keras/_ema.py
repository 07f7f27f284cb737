"""The moving average of the weights (`optimizer_config["ema"]`) as Keras optimizer variables.

Keras's own `use_ema` starts the average at the weights after the first update and, with
`gradient_accumulation_steps`, updates it on every batch; core's convention starts it at
the initial weights and updates it once per optimizer update. `with_ema(cls)` is `cls`
with Keras's EMA machinery (its `average` optimizer variables, updated after each apply)
following core's convention: the averages are set to the weights when the optimizer is
built, every update makes them `decay * ema + (1 - decay) * weights` (accumulating
batches leave them alone), and `fit` never overwrites the weights with them. Being
optimizer variables, they are in every checkpoint and restored with the rest of the
optimizer state by a skipped non-finite step.

`swapped_in(optimizer)` puts the averages into the model's variables for a while
(validation, the artifact's model).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

from keras import ops

__all__ = ["has_ema", "swapped_in", "with_ema"]


@cache
def with_ema(base: type) -> type:
    """`base` (a Keras optimizer class) keeping core's moving average of the weights.

    The class takes the decay as `ema=` (Keras builds optimizers from their config), e.g.
    `with_ema(keras.optimizers.Adam)(learning_rate=1e-3, ema=0.999)`.
    """

    class Averaged(base):
        pipekit_ema = True

        def __init__(self, *, ema: float, **kwargs: Any):
            super().__init__(
                use_ema=True, ema_momentum=float(ema), ema_overwrite_frequency=None, **kwargs
            )

        def build(self, variables: Any) -> None:
            super().build(variables)
            for var, average in zip(variables, self._model_variables_moving_average, strict=True):
                # the average starts from the initial weights (own buffer: jax donates both)
                average.assign(ops.copy(var.value))

        def _update_model_variables_moving_average(self, trainable_variables: Any) -> None:
            d = self.ema_momentum
            steps = self.gradient_accumulation_steps
            # `_iterations` counts batches here (before this one); an update ends a group
            update = True if not steps else ops.equal((self._iterations.value + 1) % steps, 0)
            for var, average in zip(
                trainable_variables, self._model_variables_moving_average, strict=True
            ):
                old = average.value
                new = ops.add(ops.multiply(d, old), ops.multiply(1.0 - d, var.value))
                average.assign(new if update is True else ops.where(update, new, old))

        def finalize_variable_values(self, var_list: Any) -> None:
            """Keep the trained weights: the average goes to the artifact, not the model."""

        def get_config(self) -> dict[str, Any]:
            config = super().get_config()
            for key in ("use_ema", "ema_momentum", "ema_overwrite_frequency"):
                config.pop(key, None)
            return {**config, "ema": self.ema_momentum}

    Averaged.__name__ = Averaged.__qualname__ = f"Averaged{base.__name__}"
    return Averaged


def _inner(optimizer: Any) -> Any:
    return getattr(optimizer, "inner_optimizer", optimizer)


def has_ema(optimizer: Any) -> bool:
    """Whether the optimizer (or the one a `LossScaleOptimizer` wraps) keeps the average."""
    return bool(getattr(_inner(optimizer), "pipekit_ema", False))


@contextmanager
def swapped_in(optimizer: Any) -> Iterator[None]:
    """The trainable variables hold their averages inside the block, their values after."""
    if not has_ema(optimizer):
        yield
        return
    inner = _inner(optimizer)
    pairs = list(
        zip(inner._trainable_variables, inner._model_variables_moving_average, strict=True)
    )
    saved = [ops.copy(var.value) for var, _ in pairs]
    for var, average in pairs:
        var.assign(ops.copy(average.value))  # own buffer: jax may donate the variable's
    try:
        yield
    finally:
        for (var, _), value in zip(pairs, saved, strict=True):
            var.assign(value)
