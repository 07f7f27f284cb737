"""An experiment for `bench_sbi.py --shared-conditioner` (Equinox only; not part of the
packages): the coupled flow head with sbi's kind of conditioner.

`losses.flow_nll(flow_hidden=H)` reads every number of its coupling conditioner
`delta = W2 tanh(W1 y_A + c1) + c2` from the network's output, per observation (a
hypernetwork). Here `W1` and `W2` are instead learned constants, the same for every
observation, and only `c1` and `c2` (with the element-wise flow's values) come from the
DeepSet. `c1` is then a linear map of the DeepSet's last hidden layer, so the conditioner
is one hidden layer on `[y_A, embedding of x]` with weights of its own: the design of sbi's
neural spline flow, written as a network whose output the unchanged flow head reads (same
loss, same `Flow`, same sampling).

The output layout is `losses.flow_nll`'s (see `pipekit_train.core.distributions._flow_math`); this
module only decides which slots are constants.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from pipekit_train.core import ConfigError, model_factory
from pipekit_train.core.losses import flow_width
from pipekit_train.equinox import deep_set

__all__ = ["shared_conditioner_deep_set", "slots"]


def slots(dim: int, flow_layers: int, flow_bins: int, flow_hidden: int) -> list[tuple[str, int]]:
    """The output in order, as `(kind, size)` runs: `"x"` (from the network), `"w1"` or
    `"w2"` (constants)."""
    elementwise = flow_width(dim, 1, flow_bins)  # one element-wise layer
    d_a = dim // 2
    p = (dim - d_a) * (3 * flow_bins - 1)
    layer = [("x", elementwise), ("w1", flow_hidden * d_a), ("x", flow_hidden)]
    layer += [("w2", p * flow_hidden), ("x", p)]
    return layer * flow_layers


class SharedConditionerSet(eqx.Module):
    """A DeepSet for the per-observation slots, constants for the others."""

    net: Any
    constants: list[jax.Array]
    runs: tuple[tuple[str, int], ...] = eqx.field(static=True)

    def __call__(self, x: jax.Array) -> jax.Array:
        own, parts, at, k = self.net(x), [], 0, 0
        for kind, size in self.runs:
            if kind == "x":
                parts.append(own[at : at + size])
                at += size
            else:
                parts.append(self.constants[k])
                k += 1
        return jnp.concatenate(parts)


@model_factory
def shared_conditioner_deep_set(
    point_size: int,
    out_size: int,
    dim: int,
    flow_layers: int,
    flow_bins: int,
    flow_hidden: int,
    embed_size: int = 64,
    width: int = 128,
    depth: int = 2,
    *,
    key: jax.Array,
) -> SharedConditionerSet:
    """`deep_set` for the flow head's per-observation values; `W1` starts as a standard
    layer's (`N(0, 1 / d_a)`), `W2` near zero (`N(0, 0.01²)`: nearly the element-wise flow)."""
    runs = slots(dim, flow_layers, flow_bins, flow_hidden)
    if out_size != flow_width(dim, flow_layers, flow_bins, flow_hidden):
        raise ConfigError(
            f"Received: out_size={out_size}, but the coupled flow over {dim} values with "
            f"{flow_layers} layers, {flow_bins} bins and {flow_hidden} hidden units has "
            f"{flow_width(dim, flow_layers, flow_bins, flow_hidden)} outputs. Pass "
            "out_size=losses.flow_width(dim, flow_layers, flow_bins, flow_hidden)."
        )
    keys = jax.random.split(key, 1 + len(runs))
    n_own = sum(size for kind, size in runs if kind == "x")
    net = deep_set(point_size, n_own, embed_size, width, depth, key=keys[0])
    constants = []
    for (kind, size), k in zip(runs, keys[1:], strict=True):
        if kind == "w1":
            constants.append(jax.random.normal(k, (size,)) / np.sqrt(dim // 2))
        elif kind == "w2":
            constants.append(0.01 * jax.random.normal(k, (size,)))
    return SharedConditionerSet(net, constants, tuple(runs))
