"""Keras optimizers and learning-rate schedules from a pipekit `optimizer_config`.

`optimizer_config` reaches the adapter normalised by core (`lr` → `learning_rate`,
lower-case `name`). Keys are Keras constructor arguments, plus a few cross-backend
aliases: `b1`/`b2` → `beta_1`/`beta_2`, `eps` → `epsilon`, `clip_norm` (or
`gradient_clip_norm`) → `global_clipnorm` (the global gradient norm, as optax's
`clip_by_global_norm` on Equinox and Lightning's `gradient_clip_val` do; Keras's own
per-variable `clipnorm` stays available under its name), `clip_value` → `clipvalue`.
`gradient_accumulation_steps` is passed through (Keras accumulates micro-batches inside
the optimizer; pipekit's step count still counts batches). A learning-rate schedule is
core's schedule dict (`{"schedule": "warmup_cosine", "peak_value": ..., ...}`, see
`pipekit_train.core._schedules`), run as a Keras `LearningRateSchedule` that follows the
same curve as every other backend. A `keras.optimizers.Optimizer` instance (with any
Keras schedule) is accepted too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pipekit_train.core import ConfigError

__all__ = ["KNOWN_OPTIMIZERS", "build_optimizer", "check_optimizer_config", "core_schedule"]

# pipekit name -> keras.optimizers class name
KNOWN_OPTIMIZERS: dict[str, str] = {
    "adadelta": "Adadelta",
    "adafactor": "Adafactor",
    "adagrad": "Adagrad",
    "adam": "Adam",
    "adamax": "Adamax",
    "adamw": "AdamW",
    "ftrl": "Ftrl",
    "lamb": "Lamb",
    "lion": "Lion",
    "muon": "Muon",
    "nadam": "Nadam",
    "rmsprop": "RMSprop",
    "sgd": "SGD",
}

_ALIASES = {
    "b1": "beta_1",
    "b2": "beta_2",
    "eps": "epsilon",
    "clip_norm": "global_clipnorm",
    "gradient_clip_norm": "global_clipnorm",
    "clip_value": "clipvalue",
}


def core_schedule(spec: Mapping[str, Any]) -> Any:
    """A `keras.optimizers.schedules.LearningRateSchedule` following core's schedule dict.

    The curve is `pipekit_train.core`'s `learning_rate_at(spec, step)` (the same for every
    backend), evaluated with `keras.ops` at the optimizer's iteration (0 for the first
    update; with gradient accumulation, iterations count updates).
    """
    import keras
    from pipekit_train.core._schedules import check_schedule

    spec = check_schedule(spec)
    ops = keras.ops

    def cosine(init: float, end: float, t: Any, steps: int) -> Any:
        frac = ops.minimum(ops.maximum(t, 0.0), float(steps)) / float(steps)
        return end + (init - end) * 0.5 * (1.0 + ops.cos(math.pi * frac))

    class CoreSchedule(keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step: Any) -> Any:
            t = ops.cast(step, "float32")
            name = spec["schedule"]
            if name == "constant":
                return ops.convert_to_tensor(float(spec["value"]), "float32") + 0.0 * t
            if name == "cosine":
                init, alpha = float(spec["init_value"]), float(spec["alpha"])
                return init * ((1.0 - alpha) * cosine(1.0, 0.0, t, spec["decay_steps"]) + alpha)
            if name == "warmup_cosine":
                warm = int(spec["warmup_steps"])
                init, peak, end = (
                    float(spec["init_value"]),
                    float(spec["peak_value"]),
                    float(spec["end_value"]),
                )
                decay = cosine(peak, end, t - warm, spec["decay_steps"] - warm)
                if warm == 0:
                    return decay
                return ops.where(t < warm, init + (peak - init) * t / float(warm), decay)
            if name == "exponential":
                p = t / float(spec["transition_steps"])
                if spec["staircase"]:
                    p = ops.floor(p)
                rate = float(spec["decay_rate"])
                value = float(spec["init_value"]) * ops.power(rate, p)
                end = spec["end_value"]
                if end is not None:
                    value = (
                        ops.maximum(value, float(end))
                        if rate < 1
                        else ops.minimum(value, float(end))
                    )
                return value
            # linear
            steps = float(spec["transition_steps"])
            init, end = float(spec["init_value"]), float(spec["end_value"])
            return init + (end - init) * ops.minimum(t, steps) / steps

        def get_config(self) -> dict[str, Any]:
            return dict(spec)

    return CoreSchedule()


def _optimizer_kwargs(config: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    config = dict(config)
    name = str(config.pop("name", "adam")).lower()
    if name not in KNOWN_OPTIMIZERS:
        raise ConfigError(
            f"`optimizer_config['name']` must be one of {sorted(KNOWN_OPTIMIZERS)} for the Keras "
            f"adapter. Received: name={name!r}."
        )
    kwargs: dict[str, Any] = {}
    for key, value in config.items():
        target = _ALIASES.get(key, key)
        if target in kwargs and kwargs[target] != value:
            raise ConfigError(
                f"`optimizer_config` sets `{target}` twice with different values. "
                f"Received: {key}={value!r}, {target}={kwargs[target]!r}. Pass only one."
            )
        kwargs[target] = value
    lr = kwargs.get("learning_rate")
    if isinstance(lr, Mapping):
        kwargs["learning_rate"] = core_schedule(lr)
    return name, kwargs


def build_optimizer(config: Any) -> Any:
    """A new, unbuilt `keras.optimizers.Optimizer` from a dict config or a Keras optimizer.

    A Keras optimizer instance is cloned (`from_config(get_config())`) so every run
    starts from fresh optimizer state.

    Raises:
        ConfigError: an unknown optimizer or schedule name, or arguments the Keras
            class rejects.
    """
    import keras

    if isinstance(config, keras.optimizers.Optimizer):
        return type(config).from_config(config.get_config())
    if not isinstance(config, Mapping):
        raise ConfigError(
            "`optimizer_config` must be a dict such as {'name': 'adam', 'lr': 1e-3} or a "
            f"`keras.optimizers.Optimizer`. Received: optimizer_config={config!r}."
        )
    name, kwargs = _optimizer_kwargs(config)
    cls = getattr(keras.optimizers, KNOWN_OPTIMIZERS[name])
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"keras.optimizers.{cls.__name__} rejected `optimizer_config`: {exc}. "
            f"Received: optimizer_config={dict(config)!r}. Use {cls.__name__}'s argument names "
            "(b1/b2/eps/clip_norm are accepted as aliases)."
        ) from exc


def check_optimizer_config(config: Any) -> None:
    """Raise `ConfigError` now for a config `build_optimizer` would reject."""
    build_optimizer(config)
