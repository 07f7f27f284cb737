"""Model factories for tests, benchmarks and examples.

Each takes JSON keyword arguments and a keyword-only `key`, as `EquinoxModelOp` calls
them; the modules act on one sample (the adapter vmaps them over the batch).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
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
    "ConvNet",
    "DropoutMLP",
    "batchnorm_mlp",
    "channels_first_conv",
    "conv_from_weights",
    "conv_net",
    "dropout_mlp",
    "golden_backend",
    "linear",
    "mlp",
    "mlp_from_weights",
    "mlp_weights",
]

_ACTIVATIONS = {"tanh": jax.nn.tanh, "relu": jax.nn.relu}

# Set while `*_from_weights` builds its operator: every array of the model is replaced by a
# given weight, so the factory returns the model's shapes only (`eqx.filter_eval_shape`) and
# no initial value is drawn. Drawing one costs a compiled `jax.random.uniform` per shape.
_SHAPES_ONLY: ContextVar[bool] = ContextVar(
    "pipekit_train_equinox_testing_shapes_only", default=False
)


@contextmanager
def _shapes_only() -> Iterator[None]:
    token = _SHAPES_ONLY.set(True)
    try:
        yield
    finally:
        _SHAPES_ONLY.reset(token)


def _uniform(key: PRNGKeyArray, shape: tuple[int, ...], dtype: Any, lim: float) -> Array:
    """`jax.random.uniform(key, shape, dtype, -lim, lim)`, compiled once per power of two.

    Equinox draws each initial array at its own shape, and on a CPU each new shape costs a
    compiled threefry program (0.2-0.3 s; 0.8-1.5 s for a rank-4 kernel). With jax's
    partitionable threefry (the default) a draw's element `i` depends on the key and `i`
    alone, numbered in row-major order, so a longer flat draw begins with the same numbers:
    this draws the next power of two and keeps the first `prod(shape)` (host-side, so the cut
    compiles nothing). `test_factories_hold_equinox_initial_values` checks the values.
    """
    n = math.prod(shape)
    if not jax.config.jax_threefry_partitionable:  # type: ignore[attr-defined]  # set at run time
        return jax.random.uniform(key, shape, dtype, -lim, lim)
    size = max(256, 1 << (n - 1).bit_length())
    flat = jax.random.uniform(key, (size,), dtype, -lim, lim)
    if isinstance(flat, jax.core.Tracer):  # built under `jit` or `vmap`: cut in the program
        return flat[:n].reshape(shape)
    return jnp.asarray(np.asarray(flat)[:n].reshape(shape))


def _linear(in_size: int, out_size: int, key: PRNGKeyArray) -> eqx.nn.Linear:
    """`eqx.nn.Linear(in_size, out_size, key=key)`, its values drawn by `_uniform`."""
    layer = eqx.filter_eval_shape(eqx.nn.Linear, in_size, out_size, key=key)
    if _SHAPES_ONLY.get():
        return layer
    weight_key, bias_key = jax.random.split(key, 2)
    lim = 1 / math.sqrt(layer.weight.shape[1])
    values = tuple(
        _uniform(k, leaf.shape, leaf.dtype, lim)
        for k, leaf in ((weight_key, layer.weight), (bias_key, layer.bias))
    )
    return eqx.tree_at(lambda lin: (lin.weight, lin.bias), layer, values)


def _mlp(
    in_size: int, out_size: int, width: int, depth: int, activation: str, key: PRNGKeyArray
) -> eqx.nn.MLP:
    """`eqx.nn.MLP(...)` with Equinox's own initial values, drawn by `_uniform`."""
    model = eqx.filter_eval_shape(
        eqx.nn.MLP, in_size, out_size, width, depth, activation=_ACTIVATIONS[activation], key=key
    )
    sizes = [in_size] + [width] * depth + [out_size]
    keys = jax.random.split(key, depth + 1)
    layers = tuple(_linear(sizes[i], sizes[i + 1], keys[i]) for i in range(depth + 1))
    return eqx.tree_at(lambda m: m.layers, model, layers)


def _filled(op: EquinoxModelOp, model: Any) -> EquinoxModelOp:
    """`op` holding `model`, once no array of it is a shape alone (see `_shapes_only`)."""
    shapes = [
        leaf for leaf in jax.tree_util.tree_leaves(model) if isinstance(leaf, jax.ShapeDtypeStruct)
    ]
    if shapes:
        raise ValueError(f"{len(shapes)} arrays of the model were not given: {shapes}.")
    return op.with_model(model)


@model_factory
def linear(in_size: int, out_size: int, *, key: PRNGKeyArray) -> eqx.nn.Linear:
    """`eqx.nn.Linear(in_size, out_size)`: one sample `(in,)` → `(out,)`."""
    return _linear(in_size, out_size, key)


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
    return _mlp(in_size, out_size, width, depth, activation, key)


def mlp_from_weights(weights: Sequence[np.ndarray], activation: str = "tanh") -> EquinoxModelOp:
    """An `EquinoxModelOp` of `mlp` holding canonical weights `[W0, b0, W1, b1, ...]`.

    `W` has shape `(fan_in, fan_out)` (see `pipekit_train.core.testing.golden_weights`).
    """
    from pipekit_train.core.testing import mlp_sizes
    from pipekit_train.equinox import EquinoxModelOp

    sizes: dict[str, Any] = mlp_sizes(weights)
    with _shapes_only():
        op = EquinoxModelOp("pipekit_train.equinox.testing:mlp", activation=activation, **sizes)
    model = op.model
    for i in range(len(model.layers)):
        w, b = weights[2 * i], weights[2 * i + 1]
        model = eqx.tree_at(
            lambda m, i=i: (m.layers[i].weight, m.layers[i].bias),  # type: ignore[misc]  # mypy cannot type a lambda with a default argument
            model,
            (jnp.asarray(w.T), jnp.asarray(b)),
        )
    return _filled(op, model)


def mlp_weights(op: EquinoxModelOp) -> list[np.ndarray]:
    """The canonical weights `[W0, b0, W1, b1, ...]` of an `mlp` operator (`W`: `(in, out)`)."""
    out: list[np.ndarray] = []
    for layer in op.model.layers:
        out += [np.asarray(layer.weight).T, np.asarray(layer.bias)]
    return out


def _conv2d(c_in: int, c_out: int, kernel_size: int, key: PRNGKeyArray) -> eqx.nn.Conv2d:
    """A periodic `eqx.nn.Conv2d` holding the initial values Equinox draws for it.

    Equinox draws its uniform `±1/sqrt(fan_in)` kernel `(c_out, c_in, k, k)` and bias
    `(c_out, 1, 1)` with `jax.random.uniform` at their shapes; `_uniform` gives the same
    values. `test_conv_net_holds_equinox_initial_values` checks them.
    """
    layer = eqx.filter_eval_shape(
        eqx.nn.Conv2d,
        c_in,
        c_out,
        kernel_size,
        padding=kernel_size // 2,
        padding_mode="CIRCULAR",
        key=key,
    )
    if _SHAPES_ONLY.get():
        return layer
    lim = 1 / math.sqrt(c_in * kernel_size * kernel_size)
    weight_key, bias_key = jax.random.split(key, 2)
    values = tuple(
        _uniform(k, leaf.shape, leaf.dtype, lim)
        for k, leaf in ((weight_key, layer.weight), (bias_key, layer.bias))
    )
    return eqx.tree_at(lambda conv: (conv.weight, conv.bias), layer, values)


class ConvNet(eqx.Module):
    """A periodic convolutional net on one channels-last field `(H, W, C_in) -> (H, W, C_out)`.

    `eqx.nn.Conv2d` acts on one channels-first sample `(C, H, W)`; this module moves the
    channel axis at its boundary, so datasets keep pipekit-train's channels-last layout.
    Every convolution pads periodically (`padding_mode="CIRCULAR"`), so the output has
    the input's grid.
    """

    layers: tuple[eqx.nn.Conv2d, ...]
    activation: str = eqx.field(static=True)

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        width: int,
        depth: int,
        kernel_size: int,
        activation: str,
        *,
        key: PRNGKeyArray,
    ):
        sizes = [in_channels] + [width] * depth + [out_channels]
        keys = jax.random.split(key, len(sizes) - 1)
        self.layers = tuple(
            _conv2d(c_in, c_out, kernel_size, k)
            for c_in, c_out, k in zip(sizes[:-1], sizes[1:], keys, strict=True)
        )
        self.activation = activation

    def __call__(
        self, x: Float[Array, "height width channels"]
    ) -> Float[Array, "height width out_channels"]:
        h = jnp.moveaxis(x, -1, 0)
        act = _ACTIVATIONS[self.activation]
        for layer in self.layers[:-1]:
            h = act(layer(h))
        return jnp.moveaxis(self.layers[-1](h), 0, -1)


@model_factory
def conv_net(
    in_channels: int,
    out_channels: int,
    width: int = 16,
    depth: int = 2,
    kernel_size: int = 3,
    activation: str = "tanh",
    *,
    key: PRNGKeyArray,
) -> ConvNet:
    """A periodic conv net on channels-last fields: `depth` hidden convolutions of `width`.

    The same architecture and initialisation family (uniform `±1/sqrt(fan_in)`,
    `fan_in = in_channels * kernel_size**2`, for kernels and biases) as `conv_net` in
    `pipekit_train.lightning.testing` and `pipekit_train.keras.testing`.
    """
    return ConvNet(in_channels, out_channels, width, depth, kernel_size, activation, key=key)


@model_factory
def channels_first_conv(
    num_spatial_dims: int,
    in_channels: int,
    out_channels: int,
    width: int = 8,
    kernel_size: int = 3,
    depth: int = 1,
    activation: str = "tanh",
    *,
    key: PRNGKeyArray,
) -> eqx.nn.Sequential:
    """A periodic conv net on one channels-first sample `(C_in, *spatial) -> (C_out, *spatial)`.

    `depth + 1` `eqx.nn.Conv` layers (`padding_mode="CIRCULAR"`, Equinox's own
    initialisation) with `activation` between them: a lifting convolution to `width`
    channels, `depth - 1` hidden ones, a projection. It takes its input as APEBench's
    pdequinox networks do (`depth=10, width=26, activation="relu"` is the shape of its
    `Conv;26;10;relu`): train it on channels-last data with
    `EquinoxModelOp(..., layout="channels_last")`.
    """
    keys = jax.random.split(key, depth + 1)
    act = eqx.nn.Lambda(_ACTIVATIONS[activation])

    def conv(c_in: int, c_out: int, k: PRNGKeyArray) -> eqx.nn.Conv:
        return eqx.nn.Conv(
            num_spatial_dims,
            c_in,
            c_out,
            kernel_size,
            padding="SAME",
            padding_mode="CIRCULAR",
            key=k,
        )

    sizes = [in_channels] + [width] * depth + [out_channels]
    layers: list[Callable[..., Any]] = []
    for i, k in enumerate(keys):
        if i:
            layers.append(act)
        layers.append(conv(sizes[i], sizes[i + 1], k))
    return eqx.nn.Sequential(layers)


def conv_from_weights(weights: Sequence[np.ndarray], activation: str = "tanh") -> EquinoxModelOp:
    """An `EquinoxModelOp` of `conv_net` holding canonical conv weights `[K0, b0, ...]`.

    `K` has shape `(kh, kw, c_in, c_out)` (see `pipekit_train.core.testing.golden_conv_weights`).
    """
    from pipekit_train.core.testing import conv_sizes
    from pipekit_train.equinox import EquinoxModelOp

    with _shapes_only():
        op = EquinoxModelOp(
            "pipekit_train.equinox.testing:conv_net", activation=activation, **conv_sizes(weights)
        )
    model = op.model
    for i in range(len(model.layers)):
        k, b = weights[2 * i], weights[2 * i + 1]

        def where(m: Any, i: int = i) -> tuple[Any, Any]:
            return (m.layers[i].weight, m.layers[i].bias)

        model = eqx.tree_at(
            where,
            model,
            (jnp.asarray(np.transpose(k, (3, 2, 0, 1))), jnp.asarray(b[:, None, None])),
        )
    return _filled(op, model)


def golden_backend() -> GoldenBackend:
    """The Equinox backend of the cross-backend golden-run suite."""
    from pipekit_train.core.testing import GoldenBackend
    from pipekit_train.equinox import Equinox

    return GoldenBackend(
        name="equinox",
        model_from_weights=mlp_from_weights,
        adapter=lambda p: Equinox(precision=p),
        conv_from_weights=conv_from_weights,
        weights_of=mlp_weights,
    )


class DropoutMLP(eqx.Module):
    """A one-hidden-layer MLP with dropout (needs a key in training mode)."""

    hidden: eqx.nn.Linear
    dropout: eqx.nn.Dropout
    out: eqx.nn.Linear

    def __init__(self, in_size: int, out_size: int, width: int, p: float, *, key: PRNGKeyArray):
        k1, k2 = jax.random.split(key)
        self.hidden = _linear(in_size, width, k1)
        self.dropout = eqx.nn.Dropout(p)
        self.out = _linear(width, out_size, k2)

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
        self.hidden = _linear(in_size, width, k1)
        self.norm = eqx.nn.BatchNorm(width, axis_name="batch", mode="ema")
        self.out = _linear(width, out_size, k2)

    def __call__(self, x: Features, state: eqx.nn.State) -> tuple[Outputs, eqx.nn.State]:
        h, state = self.norm(self.hidden(x), state)
        return self.out(jax.nn.relu(h)), state


@model_factory
def batchnorm_mlp(
    in_size: int, out_size: int, width: int = 16, *, key: PRNGKeyArray
) -> tuple[BatchNormMLP, eqx.nn.State]:
    """`eqx.nn.make_with_state(BatchNormMLP)(...)`: returns `(model, state)`."""
    return eqx.nn.make_with_state(BatchNormMLP)(in_size, out_size, width, key=key)
