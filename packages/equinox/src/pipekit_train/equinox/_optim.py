"""optax from the canonical optimizer spec (`pipekit_train.core.adapter.optimizer_spec`).

Core validates `optimizer_config` and fills in every default; this module translates it:

| spec | optax |
|---|---|
| `adam` / `adamw` | `optax.adam` / `optax.adamw` (`b1`, `b2`, `eps`; `weight_decay` decoupled) |
| `sgd` | `optax.sgd(momentum, nesterov)`, plus decoupled decay `-lr·wd·param` |
| `rmsprop` | `optax.rmsprop(decay, eps, momentum, centered, eps_in_sqrt=False)`, plus decay |
| `adagrad` | `optax.adagrad(initial_accumulator_value, eps)`, plus decay |
| `clip_norm` / `clip_value` | `optax.clip_by_global_norm` / `optax.clip` before the update |
| schedules | the optax schedule of the same curve (core's `SCHEDULES` table) |
| `ema` | `with_ema` (`_ema.py`): the average in the optimizer state, inside `MultiSteps` |
| core's learning-rate scale (`ReduceLROnPlateau`) | `scale_by_lr_scale()` after the optimizer: the update times a scalar kept in the optimizer state |

An `optax.GradientTransformation` (or anything with `init`/`update`, such as
`optax.MultiSteps`) passed as `optimizer_config` is used as is.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import jax
import jax.numpy as jnp
import optax

from pipekit_train.core.adapter import ConfigError, OptimizerSpec, check_schedule, optimizer_spec

from ._ema import with_ema

__all__ = [
    "SCHEDULES",
    "BuiltOptimizer",
    "LRScaleState",
    "build_optimizer",
    "build_schedule",
    "scale_by_lr_scale",
]

SCHEDULES: Final[dict[str, Callable[..., optax.Schedule]]] = {
    "constant": optax.constant_schedule,
    "cosine": optax.cosine_decay_schedule,
    "warmup_cosine": optax.warmup_cosine_decay_schedule,
    "exponential": optax.exponential_decay,
    "linear": optax.linear_schedule,
}
"""Core's schedule names and the optax schedule each one becomes."""


@dataclass(frozen=True)
class BuiltOptimizer:
    """An optimizer built from a config.

    Attributes:
        transform: what `init`/`update` are called on.
        schedule: the learning-rate schedule (step → lr) or a constant, when known.
    """

    transform: Any
    schedule: Callable[[Any], Any] | float | None
    runtime_lr: bool = False
    accumulate: int = 1
    lr_scale: bool = False

    def cache_key(self, config: Any) -> str | None:
        """The JSON of the config that fixes the compiled step (None: never share).

        A constant learning rate lives in the optimizer state (`runtime_lr`), so runs
        that differ only in it share one compilation: a learning-rate sweep compiles once.
        """
        if not isinstance(config, Mapping):
            return None
        cfg = dict(config, accumulate=self.accumulate)
        if self.lr_scale:
            cfg["lr_scale"] = True
        if self.runtime_lr:
            cfg["learning_rate"] = "<in optimizer state>"
        try:
            return json.dumps(cfg, sort_keys=True)
        except (TypeError, ValueError):
            return None

    def learning_rate(self, step: int) -> float | None:
        """The learning rate at optimizer update `step`, if known."""
        if self.schedule is None:
            return None
        if callable(self.schedule):
            return float(self.schedule(step))
        return float(self.schedule)


def build_schedule(config: Any) -> Callable[[Any], Any] | float:
    """A learning rate: a positive number, or the optax schedule of a core schedule dict.

    Raises:
        ConfigError: the schedule dict is not one of core's (see `SCHEDULES`).
    """
    if not isinstance(config, Mapping):
        return float(config)
    spec = check_schedule(config)
    kwargs = {k: v for k, v in spec.items() if k != "schedule"}
    name = spec["schedule"]
    if name == "exponential" and kwargs.get("end_value") is None:
        kwargs.pop("end_value", None)
    return SCHEDULES[name](**kwargs)


def _base_transform(spec: OptimizerSpec, lr: Any) -> tuple[Callable[..., Any], dict[str, Any]]:
    """The optax function and its keyword arguments for the spec (decay handled apart)."""
    h = spec.hyper
    if spec.name in ("adam", "adamw"):
        kwargs = {"learning_rate": lr, "b1": h["b1"], "b2": h["b2"], "eps": h["eps"]}
        if spec.weight_decay:
            return optax.adamw, {**kwargs, "weight_decay": spec.weight_decay}
        return optax.adam, kwargs
    if spec.name == "sgd":
        momentum = h["momentum"] or None
        return optax.sgd, {"learning_rate": lr, "momentum": momentum, "nesterov": h["nesterov"]}
    if spec.name == "rmsprop":
        return optax.rmsprop, {
            "learning_rate": lr,
            "decay": h["decay"],
            "eps": h["eps"],
            "eps_in_sqrt": False,
            "centered": h["centered"],
            "momentum": h["momentum"] or None,
        }
    if spec.name == "adagrad":
        return optax.adagrad, {
            "learning_rate": lr,
            "initial_accumulator_value": h["initial_accumulator_value"],
            "eps": h["eps"],
        }
    raise ConfigError(  # pragma: no cover - core's table and this one are kept in step
        f"The Equinox adapter has no translation for optimizer {spec.name!r}."
    )


class LRScaleState(NamedTuple):
    """The state of `scale_by_lr_scale`: core's learning-rate scale (float32 scalar)."""

    lr_scale: jax.Array


def scale_by_lr_scale() -> optax.GradientTransformation:
    """Multiply the updates by a scalar kept in the state (core's learning-rate scale).

    Placed after an optimizer whose last factor is the learning rate (every translation
    here, decoupled decay included), it is the same as training at `lr * scale`. The
    scale is data, not a constant of the compiled step: changing it (`set_lr_scale`)
    never recompiles, and it is saved with the optimizer state.
    """

    def init(params: Any) -> LRScaleState:
        return LRScaleState(jnp.ones((), jnp.float32))

    def update(updates: Any, state: LRScaleState, params: Any = None) -> Any:
        scale = state.lr_scale
        return jax.tree.map(lambda u: u * scale.astype(u.dtype), updates), state

    return optax.GradientTransformation(init, update)


def build_optimizer(config: Any, *, accumulate: int = 1, lr_scale: bool = False) -> BuiltOptimizer:
    """Build the optax optimizer a plan's `optimizer_config` describes.

    Args:
        config: core's canonical config dict (see `pipekit_train.core.spec.OPTIMIZERS`),
            or a ready optimizer with `init` and `update` (an
            `optax.GradientTransformation`, `optax.MultiSteps`).
        accumulate: `TrainingLoop(accumulate_grad_batches=k)`: wrap the optimizer in
            `optax.MultiSteps(k)`, which averages k batches' gradients into one update.
        lr_scale: end the chain with `scale_by_lr_scale()` (plans whose callbacks change
            the learning rate, such as `ReduceLROnPlateau`).

    Returns:
        The transform and its schedule.

    Raises:
        ConfigError: an invalid config, or an object that is not an optimizer.
    """
    if not isinstance(config, Mapping):
        if callable(getattr(config, "init", None)) and callable(getattr(config, "update", None)):
            if lr_scale:
                config = optax.chain(config, scale_by_lr_scale())
            if accumulate > 1:
                config = optax.MultiSteps(config, every_k_schedule=accumulate)
            return BuiltOptimizer(
                transform=config, schedule=None, accumulate=accumulate, lr_scale=lr_scale
            )
        raise ConfigError(
            "`optimizer_config` must be a dict such as {'name': 'adam', 'lr': 1e-3} or an "
            f"optax.GradientTransformation. Received: optimizer_config={config!r}."
        )
    spec = optimizer_spec(config)
    schedule = build_schedule(spec.learning_rate)
    fn, kwargs = _base_transform(spec, schedule)
    decay_outside = bool(spec.weight_decay) and "weight_decay" not in kwargs
    runtime_lr = not callable(schedule) and not decay_outside
    if runtime_lr:
        # The constant learning rate becomes a scalar in the optimizer state, so the
        # compiled step does not depend on its value (every other argument stays static):
        # a learning-rate sweep compiles once.
        static = [k for k in kwargs if k != "learning_rate"]
        transform = optax.inject_hyperparams(fn, static_args=static)(**kwargs)
    else:
        transform = fn(**kwargs)
    if decay_outside:
        transform = _with_decoupled_decay(transform, spec.weight_decay, schedule)
    if spec.clip_norm is not None:
        transform = optax.chain(optax.clip_by_global_norm(spec.clip_norm), transform)
    elif spec.clip_value is not None:
        transform = optax.chain(optax.clip(spec.clip_value), transform)
    if lr_scale:
        transform = optax.chain(transform, scale_by_lr_scale())
    if spec.ema is not None:
        # outermost, inside MultiSteps: one average update per optimizer update, of the
        # parameters after the whole (rate-scaled) update
        transform = with_ema(transform, spec.ema)
    if accumulate > 1:
        transform = optax.MultiSteps(transform, every_k_schedule=accumulate)
    return BuiltOptimizer(
        transform=transform,
        schedule=schedule,
        runtime_lr=runtime_lr,
        accumulate=accumulate,
        lr_scale=lr_scale,
    )


def _with_decoupled_decay(
    opt: optax.GradientTransformation, weight_decay: float, schedule: Any
) -> optax.GradientTransformation:
    """`opt(g) - lr * weight_decay * params`: AdamW-style decay for any optimizer."""
    scale = optax.scale_by_learning_rate(schedule)

    def init(params: Any) -> Any:
        return (opt.init(params), scale.init(params))

    def update(updates: Any, state: Any, params: Any = None, **extra: Any) -> Any:
        if params is None:
            raise ValueError("weight_decay needs the parameters passed to update().")
        u_opt, s_opt = opt.update(updates, state[0], params, **extra)
        u_dec, s_dec = scale.update(
            jax.tree.map(lambda p: weight_decay * p, params), state[1], params
        )
        return jax.tree.map(lambda a, b: a + b, u_opt, u_dec), (s_opt, s_dec)

    return optax.GradientTransformation(init, update)
