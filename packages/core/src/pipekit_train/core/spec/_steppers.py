"""Solvers in the loop: how a rollout names and checks the steppers it calls.

A *stepper* is `fn(state) -> next state` on a batch of physical (un-normalised) states,
batch axis first, written in the array library of the arrays it is called with
(`jax.numpy` inside an Equinox or Keras-on-jax step, torch inside a `Torch()`,
`Lightning()` or Keras-on-torch step, numpy on the host). A stepper written once with
the array API (`xp = array_api_compat.array_namespace(state)`) serves all of them.

Two roles (`Rollout` and `NeuralForward` hold them):

- the *reference* stepper of the diverted chain (trainax's `ref_stepper`): each unrolled
  model step is compared with it applied to the model's previous state;
- the *coarse* stepper a model corrects (apebench's `coarse_stepper`, solver in the
  loop): `correction="parallel"` is `next = coarse(x) + model(x)`,
  `correction="sequential"` feeds the model `coarse(x)` (and, with `residual=True`,
  adds it back: `next = coarse(x) + model(coarse(x))`).

A stepper is code, not JSON: plans and resume keys hold its import path
(`"module:qualname"`), so it must be importable by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pipekit_train.core._errors import ConfigError
from pipekit_train.core._imports import import_string

__all__ = [
    "CORRECTIONS",
    "TARGETS",
    "check_correction",
    "check_stepper_shape",
    "resolve_stepper",
]

TARGETS = ("trajectory", "diverted")
"""What each unrolled step is compared with: the stored trajectory, or the reference
stepper applied to the model's previous state (the diverted chain)."""

CORRECTIONS = ("parallel", "sequential")
"""How a model corrects a coarse stepper (see the module)."""


def resolve_stepper(field: str, value: Any) -> tuple[Callable[[Any], Any], str]:
    """`(the stepper, its import path)` of a stepper given as a callable or an import string.

    Args:
        field: the user-facing field (`"ref_stepper"`, `"coarse_stepper"`).
        value: a module-level function (or class), or an import string `"module:name"`
            (which may name a module-level callable instance).

    Raises:
        ConfigError: not callable, not importable, or a lambda, closure or instance that
            has no import path.
    """
    if isinstance(value, str):
        fn = import_string(value, field=field)
        if not callable(fn):
            raise ConfigError(
                f"`{field}` must name a callable stepper fn(state) -> next state. Received: "
                f"{field}={value!r}, which names a {type(fn).__name__}."
            )
        return fn, value
    if not callable(value):
        raise ConfigError(
            f"`{field}` must be a callable stepper fn(state) -> next state (a batch of "
            f"physical states in, the next states out) or its import string "
            f"'module:function'. Received: {field}={value!r:.80}."
        )
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        raise ConfigError(
            f"`{field}` must be importable by name, so the plan and its resume key can "
            f"name it. Received: {field}={value!r:.80} (a lambda, a closure or an "
            "instance). Define a module-level function (it may call an instance, e.g. "
            "`def ks(u): return jax.vmap(KS_STEPPER)(u)`), or pass the import string "
            "'module:NAME' of a module-level callable."
        )
    return value, f"{module}:{qualname}"


def check_correction(
    correction: Any, coarse_stepper: Any, residual: bool, *, owner: str = "Rollout"
) -> None:
    """Refuse a correction without its stepper, a stepper without its mode, an unknown
    mode, and a parallel correction that does not add the coarse step.

    Raises:
        ConfigError: naming the field, the value and the fix.
    """
    if correction is not None and correction not in CORRECTIONS:
        raise ConfigError(
            f"`correction` must be one of {list(CORRECTIONS)} or None. Received: "
            f"correction={correction!r}. Use 'parallel' (next = coarse(x) + model(x)) or "
            "'sequential' (the model sees coarse(x))."
        )
    if correction is not None and coarse_stepper is None:
        raise ConfigError(
            f"A correction needs the coarse stepper it corrects. Received: {owner}("
            f"correction={correction!r}, coarse_stepper=None). Pass coarse_stepper=fn, "
            "fn(state) -> next state on a batch of physical states."
        )
    if correction is None and coarse_stepper is not None:
        raise ConfigError(
            f"Say how the model corrects the coarse stepper. Received: {owner}("
            "coarse_stepper=..., correction=None). Pass correction='parallel' (next = "
            "coarse(x) + model(x), with residual=True) or correction='sequential' (next = "
            "model(coarse(x)); with residual=True coarse(x) + model(coarse(x)))."
        )
    if correction == "parallel" and not residual:
        raise ConfigError(
            "A parallel correction adds the model's output to the coarse step (next = "
            f"coarse(x) + model(x)). Received: {owner}(correction='parallel', "
            "residual=False). Use residual=True (windows with targets='increments'), or "
            "correction='sequential' for next = model(coarse(x))."
        )


def check_stepper_shape(
    field: str, state_shape: Sequence[int], out_shape: Sequence[int] | None
) -> None:
    """Refuse a stepper whose output on a batch of states of `state_shape` (batch axis
    first) has another shape (`out_shape`; None: not probed).

    Raises:
        ConfigError: the shapes differ.
    """
    if out_shape is None:
        return
    want, got = tuple(int(d) for d in state_shape), tuple(int(d) for d in out_shape)
    if want != got:
        raise ConfigError(
            f"`{field}` must return the next states in the shape of the states it is given "
            f"(batch axis first). Received: {field} maps a batch of shape {want} to shape "
            f"{got}. Return fn(state).shape == state.shape (vmap a per-state stepper over "
            "the batch axis)."
        )
