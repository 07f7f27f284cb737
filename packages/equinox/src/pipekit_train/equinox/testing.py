"""Model factories for tests, benchmarks and examples.

Each takes JSON keyword arguments and a keyword-only `key`, as `EquinoxModelOp` calls
them; the modules act on one sample (the adapter vmaps them over the batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

import equinox as eqx
from pipekit_train.core import model_factory

if TYPE_CHECKING:
    from pipekit_train.core.testing import GoldenBackend
    from pipekit_train.equinox import EquinoxModelOp

Features = Float[Array, " features"]
"""One input sample."""
Outputs = Float[Array, " outputs"]
"""One output sample."""

__all__ = [
    "BatchNormMLP",
    "DropoutMLP",
    "batchnorm_mlp",
    "dropout_mlp",
    "golden_backend",
    "linear",
    "mlp",
    "mlp_from_weights",
]

_ACTIVATIONS = {"tanh": jax.nn.tanh, "relu": jax.nn.relu}


@model_factory
def linear(in_size: int, out_size: int, *, key: PRNGKeyArray) -> eqx.nn.Linear:
    """`eqx.nn.Linear(in_size, out_size)`: one sample `(in,)` → `(out,)`."""
    return eqx.nn.Linear(in_size, out_size, key=key)


@model_factory
def mlp(
    in_size: int,
    out_size: int,
    width: int = 32,
    depth: int = 1,
    activation: str = "tanh",
    *,
    key: PRNGKeyArray,
) -> eqx.nn.MLP:
    """`eqx.nn.MLP`: `depth` hidden layers of `width` with `activation` (`"tanh"`/`"relu"`).

    The same architecture and initialisation family (uniform `±1/sqrt(fan_in)`) as
    `mlp` in `pipekit_train.lightning.testing` and `pipekit_train.keras.testing`.
    """
    return eqx.nn.MLP(in_size, out_size, width, depth, activation=_ACTIVATIONS[activation], key=key)


def mlp_from_weights(weights: Sequence[np.ndarray], activation: str = "tanh") -> EquinoxModelOp:
    """An `EquinoxModelOp` of `mlp` holding canonical weights `[W0, b0, W1, b1, ...]`.

    `W` has shape `(fan_in, fan_out)` (see `pipekit_train.core.testing.golden_weights`).
    """
    from pipekit_train.core.testing import mlp_sizes
    from pipekit_train.equinox import EquinoxModelOp

    sizes: dict[str, Any] = mlp_sizes(weights)
    op = EquinoxModelOp("pipekit_train.equinox.testing:mlp", activation=activation, **sizes)
    model = op.model
    for i in range(len(model.layers)):
        w, b = weights[2 * i], weights[2 * i + 1]
        model = eqx.tree_at(
            lambda m, i=i: (m.layers[i].weight, m.layers[i].bias),  # type: ignore[misc]  # mypy cannot type a lambda with a default argument
            model,
            (jnp.asarray(w.T), jnp.asarray(b)),
        )
    return op.with_model(model)


def golden_backend() -> GoldenBackend:
    """The Equinox backend of the cross-backend golden-run suite."""
    from pipekit_train.core.testing import GoldenBackend
    from pipekit_train.equinox import Equinox

    return GoldenBackend(
        name="equinox", model_from_weights=mlp_from_weights, adapter=lambda p: Equinox(precision=p)
    )


class DropoutMLP(eqx.Module):
    """A one-hidden-layer MLP with dropout (needs a key in training mode)."""

    hidden: eqx.nn.Linear
    dropout: eqx.nn.Dropout
    out: eqx.nn.Linear

    def __init__(self, in_size: int, out_size: int, width: int, p: float, *, key: PRNGKeyArray):
        k1, k2 = jax.random.split(key)
        self.hidden = eqx.nn.Linear(in_size, width, key=k1)
        self.dropout = eqx.nn.Dropout(p)
        self.out = eqx.nn.Linear(width, out_size, key=k2)

    def __call__(self, x: Features, *, key: PRNGKeyArray | None = None) -> Outputs:
        h = jax.nn.relu(self.hidden(x))
        return self.out(self.dropout(h, key=key))


@model_factory
def dropout_mlp(
    in_size: int, out_size: int, width: int = 32, p: float = 0.2, *, key: PRNGKeyArray
) -> DropoutMLP:
    """`DropoutMLP(in_size, out_size, width, p)`."""
    return DropoutMLP(in_size, out_size, width, p, key=key)


class BatchNormMLP(eqx.Module):
    """Linear → BatchNorm → ReLU → Linear; called as `model(x, state) -> (y, state)`."""

    hidden: eqx.nn.Linear
    norm: eqx.nn.BatchNorm
    out: eqx.nn.Linear

    def __init__(self, in_size: int, out_size: int, width: int, *, key: PRNGKeyArray):
        k1, k2 = jax.random.split(key)
        self.hidden = eqx.nn.Linear(in_size, width, key=k1)
        self.norm = eqx.nn.BatchNorm(width, axis_name="batch", mode="ema")
        self.out = eqx.nn.Linear(width, out_size, key=k2)

    def __call__(self, x: Features, state: eqx.nn.State) -> tuple[Outputs, eqx.nn.State]:
        h, state = self.norm(self.hidden(x), state)
        return self.out(jax.nn.relu(h)), state


@model_factory
def batchnorm_mlp(
    in_size: int, out_size: int, width: int = 16, *, key: PRNGKeyArray
) -> tuple[BatchNormMLP, eqx.nn.State]:
    """`eqx.nn.make_with_state(BatchNormMLP)(...)`: returns `(model, state)`."""
    return eqx.nn.make_with_state(BatchNormMLP)(in_size, out_size, width, key=key)
