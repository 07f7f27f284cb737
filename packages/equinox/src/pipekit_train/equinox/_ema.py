"""The moving average of the weights (`optimizer_config["ema"]`) as part of the optax state.

`with_ema(transform, decay)` wraps the optimizer: its state holds the inner state and the
average (`EmaState`), which starts as a copy of the initial parameters and after every
update becomes `decay * ema + (1 - decay) * (params + updates)`. Living in the optimizer
state, the average is checkpointed with it, kept unchanged by a skipped non-finite step
(the step restores the optimizer state) and, inside `optax.MultiSteps`, updated once per
optimizer update. `find_ema` finds it in any optimizer state (`has_ema`: whether there is
one), `ema_model` puts it into a model.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

import equinox as eqx

__all__ = ["EmaState", "ema_model", "find_ema", "has_ema", "with_ema"]


class EmaState(NamedTuple):
    """The state of `with_ema`: the wrapped optimizer's state and the average."""

    inner: Any
    ema: Any


def with_ema(inner: optax.GradientTransformation, decay: float) -> optax.GradientTransformation:
    """`inner`, also keeping the exponential moving average of the parameters it updates."""
    d = float(decay)

    def init(params: Any) -> EmaState:
        # own buffers: an alias of a parameter would be donated twice by the step
        copy = jax.tree.map(lambda p: jnp.array(p, copy=True), params)
        return EmaState(inner.init(params), copy)

    def update(updates: Any, state: EmaState, params: Any = None, **extra: Any) -> Any:
        if params is None:
            raise ValueError("optimizer_config['ema'] needs the parameters passed to update().")
        out, inner_state = inner.update(updates, state.inner, params, **extra)
        ema = jax.tree.map(lambda e, p, u: d * e + (1 - d) * (p + u), state.ema, params, out)
        return out, EmaState(inner_state, ema)

    return optax.GradientTransformation(init, update)


def find_ema(opt_state: Any) -> Any | None:
    """The average held by an optimizer state (None: the optimizer keeps none)."""
    found = [
        s
        for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, EmaState))
        if isinstance(s, EmaState)
    ]
    return found[0].ema if found else None


def has_ema(opt_state: Any) -> bool:
    """Whether an optimizer state holds the average (`optimizer_config["ema"]`)."""
    return find_ema(opt_state) is not None


def ema_model(model: Any, opt_state: Any) -> Any:
    """`model` with its trainable arrays replaced by the average (as is when there is none)."""
    ema = find_ema(opt_state)
    if ema is None:
        return model
    return eqx.combine(ema, eqx.filter(model, lambda x: not eqx.is_inexact_array(x)))
