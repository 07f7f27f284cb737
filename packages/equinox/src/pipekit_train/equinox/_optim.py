"""Building an optax optimizer from a JSON `optimizer_config`.

Core has already normalised the config (`lr` → `learning_rate`, a lower-case `name`,
checked numbers); this module maps it onto optax:

```python
{"name": "adamw", "learning_rate": 1e-3, "weight_decay": 1e-4, "clip_norm": 1.0}
{"name": "sgd", "learning_rate": {"schedule": "cosine", "init_value": 0.1, "decay_steps": 1000},
 "momentum": 0.9}
```

An `optax.GradientTransformation` (or anything with `init`/`update`, such as
`optax.MultiSteps`) passed as `optimizer_config` is used as is.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import jax
import optax

from pipekit_train.core import ConfigError

__all__ = ["OPTIMIZERS", "SCHEDULES", "BuiltOptimizer", "build_optimizer", "build_schedule"]

OPTIMIZERS: Final[dict[str, Callable[..., optax.GradientTransformation]]] = {
    name: getattr(optax, name)
    for name in (
        "adabelief",
        "adadelta",
        "adafactor",
        "adagrad",
        "adam",
        "adamax",
        "adamaxw",
        "adamw",
        "adan",
        "amsgrad",
        "fromage",
        "lamb",
        "lars",
        "lion",
        "nadam",
        "nadamw",
        "noisy_sgd",
        "novograd",
        "optimistic_gradient_descent",
        "radam",
        "rmsprop",
        "rprop",
        "sgd",
        "sign_sgd",
        "signum",
        "sm3",
        "yogi",
    )
    if hasattr(optax, name)
}
"""Optimizer names accepted in `optimizer_config['name']` (the optax function of that name)."""

SCHEDULES: Final[dict[str, Callable[..., optax.Schedule]]] = {
    "constant": optax.constant_schedule,
    "cosine": optax.cosine_decay_schedule,
    "cosine_decay": optax.cosine_decay_schedule,
    "warmup_cosine": optax.warmup_cosine_decay_schedule,
    "warmup_cosine_decay": optax.warmup_cosine_decay_schedule,
    "exponential": optax.exponential_decay,
    "exponential_decay": optax.exponential_decay,
    "warmup_exponential": optax.warmup_exponential_decay_schedule,
    "linear": optax.linear_schedule,
    "polynomial": optax.polynomial_schedule,
    "piecewise_constant": optax.piecewise_constant_schedule,
    "cosine_onecycle": optax.cosine_onecycle_schedule,
    "linear_onecycle": optax.linear_onecycle_schedule,
    "warmup_constant": optax.warmup_constant_schedule,
    "sgdr": optax.sgdr_schedule,
}
"""Schedule names accepted in `learning_rate={"schedule": name, ...}`."""

# Keys of the config handled here rather than forwarded to the optax function.
_RESERVED: Final = (
    "name",
    "learning_rate",
    "clip_norm",
    "gradient_clip_norm",
    "clip_value",
    "weight_decay",
)


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

    def cache_key(self, config: Any) -> str | None:
        """The JSON of the config that fixes the compiled step (None: never share).

        A constant learning rate lives in the optimizer state (`runtime_lr`), so runs
        that differ only in it share one compilation: a learning-rate sweep compiles once.
        """
        if not isinstance(config, Mapping):
            return None
        cfg = dict(config)
        if self.runtime_lr:
            cfg["learning_rate"] = "<in optimizer state>"
        try:
            return json.dumps(cfg, sort_keys=True)
        except (TypeError, ValueError):
            return None

    def learning_rate(self, step: int) -> float | None:
        """The learning rate at optimizer step `step`, if known."""
        if self.schedule is None:
            return None
        if callable(self.schedule):
            return float(self.schedule(step))
        return float(self.schedule)


def _call_checked(
    fn: Callable[..., Any], kwargs: Mapping[str, Any], *, what: str, field: str
) -> Any:
    """Call `fn(**kwargs)`, turning a bad or missing argument into a `ConfigError`."""
    params = inspect.signature(fn).parameters
    takes_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = sorted(k for k in kwargs if k not in params and not takes_var_kw)
    if unknown:
        accepted = sorted(
            k for k, p in params.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL
        )
        raise ConfigError(
            f"`{field}` has options {what} does not take. Received: {', '.join(f'{k}={kwargs[k]!r}' for k in unknown)}. "
            f"{what} accepts {accepted}."
        )
    missing = sorted(
        k
        for k, p in params.items()
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        and k not in kwargs
    )
    if missing:
        raise ConfigError(
            f"`{field}` is missing arguments of {what}. Received: {dict(kwargs)!r}. Add {missing}."
        )
    try:
        return fn(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"`{field}` is not valid for {what}: {exc}. Received: {dict(kwargs)!r}."
        ) from exc


def _piecewise_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    # JSON object keys are strings; optax wants int step boundaries.
    bas = kwargs.get("boundaries_and_scales")
    if isinstance(bas, Mapping):
        kwargs["boundaries_and_scales"] = {int(k): float(v) for k, v in bas.items()}
    return kwargs


def build_schedule(config: Any) -> Callable[[Any], Any] | float:
    """A learning rate: a positive number, or a schedule from `{"schedule": name, ...}`.

    Raises:
        ConfigError: an unknown schedule name or bad schedule arguments.
    """
    if not isinstance(config, Mapping):
        return float(config)
    kwargs = dict(config)
    name = kwargs.pop("schedule", None) or kwargs.pop("name", None)
    kwargs.pop("name", None)
    if not isinstance(name, str) or name.lower() not in SCHEDULES:
        raise ConfigError(
            f"`learning_rate['schedule']` must be one of {sorted(SCHEDULES)}. "
            f"Received: schedule={name!r}."
        )
    name = name.lower()
    if name == "piecewise_constant":
        kwargs = _piecewise_kwargs(kwargs)
    if name == "constant" and "value" not in kwargs and "init_value" in kwargs:
        kwargs["value"] = kwargs.pop("init_value")
    fn = SCHEDULES[name]
    return _call_checked(fn, kwargs, what=f"optax.{fn.__name__}", field="learning_rate")


def build_optimizer(config: Any) -> BuiltOptimizer:
    """Build the optax optimizer a plan's `optimizer_config` describes.

    Args:
        config: a normalised dict (`name`, `learning_rate` number or schedule dict,
            optional `clip_norm`, `clip_value`, `weight_decay`, and any keyword of the
            optax function, e.g. `b1`, `momentum`), or a ready optimizer with `init`
            and `update` (an `optax.GradientTransformation`, `optax.MultiSteps`).

    Returns:
        The transform and its schedule.

    Raises:
        ConfigError: unknown names, bad arguments, or an object that is not an optimizer.
    """
    if not isinstance(config, Mapping):
        if callable(getattr(config, "init", None)) and callable(getattr(config, "update", None)):
            return BuiltOptimizer(transform=config, schedule=None)
        raise ConfigError(
            "`optimizer_config` must be a dict such as {'name': 'adam', 'lr': 1e-3} or an "
            f"optax.GradientTransformation. Received: optimizer_config={config!r}."
        )
    cfg = dict(config)
    name = str(cfg.get("name", "adam")).lower()
    if name not in OPTIMIZERS:
        raise ConfigError(
            f"`optimizer_config['name']` must be an optax optimizer. Received: name={name!r}. "
            f"Use one of {sorted(OPTIMIZERS)}, or pass an optax.GradientTransformation."
        )
    fn = OPTIMIZERS[name]
    params = inspect.signature(fn).parameters
    lr_key = "learning_rate" if "learning_rate" in params else None
    schedule = build_schedule(cfg.get("learning_rate", 1e-3))
    kwargs = {k: v for k, v in cfg.items() if k not in _RESERVED}
    if lr_key:
        kwargs[lr_key] = schedule
    weight_decay = cfg.get("weight_decay")
    decay_outside = False
    if weight_decay is not None:
        if (
            isinstance(weight_decay, bool)
            or not isinstance(weight_decay, (int, float))
            or weight_decay < 0
        ):
            raise ConfigError(
                "`optimizer_config['weight_decay']` must be a non-negative number. "
                f"Received: weight_decay={weight_decay!r}."
            )
        if "weight_decay" in params:
            kwargs["weight_decay"] = float(weight_decay)
        else:
            decay_outside = True
    transform = _call_checked(fn, kwargs, what=f"optax.{name}", field="optimizer_config")
    runtime_lr = bool(lr_key) and not callable(schedule) and not decay_outside
    if runtime_lr:
        # The constant learning rate becomes a scalar in the optimizer state, so the
        # compiled step does not depend on its value (every other argument stays static).
        static = [k for k, p in params.items() if k != lr_key and p.kind is not p.VAR_KEYWORD]
        transform = optax.inject_hyperparams(fn, static_args=static)(**kwargs)
    chain: list[optax.GradientTransformation] = []
    clip_norm = cfg.get("clip_norm", cfg.get("gradient_clip_norm"))
    if clip_norm is not None:
        chain.append(optax.clip_by_global_norm(float(clip_norm)))
    clip_value = cfg.get("clip_value")
    if clip_value is not None:
        if (
            isinstance(clip_value, bool)
            or not isinstance(clip_value, (int, float))
            or clip_value <= 0
        ):
            raise ConfigError(
                f"`optimizer_config['clip_value']` must be a positive number. Received: clip_value={clip_value!r}."
            )
        chain.append(optax.clip(float(clip_value)))
    if decay_outside:
        transform = _with_decoupled_decay(transform, float(weight_decay), schedule)
    if chain:
        transform = optax.chain(*chain, transform)
    return BuiltOptimizer(
        transform=transform, schedule=schedule if lr_key else None, runtime_lr=runtime_lr
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
