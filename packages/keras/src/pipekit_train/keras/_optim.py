"""Keras optimizers and learning-rate schedules from the canonical optimizer spec.

Core validates `optimizer_config` and fills in every default
(`pipekit_train.core.adapter.optimizer_spec`); this module translates it:

| spec | Keras |
|---|---|
| `adam` / `adamw` | `keras.optimizers.Adam` / `AdamW` (`beta_1`, `beta_2`, `epsilon`) |
| `sgd` | `SGD(momentum, nesterov)` |
| `rmsprop` | `RMSprop(rho=decay, epsilon, momentum, centered)` |
| `adagrad` | `Adagrad(initial_accumulator_value, epsilon)` |
| `weight_decay` | Keras's own `weight_decay` argument, which is decoupled on every optimizer |
| `clip_norm` / `clip_value` | `global_clipnorm` / `clipvalue` |
| schedules | a `LearningRateSchedule` following core's curve (`build_schedule`) |
| core's learning-rate scale | the rate (constant or schedule) times an optimizer variable (`scaled_schedule`, `attach_lr_scale`) |

A `keras.optimizers.Optimizer` instance (with any Keras schedule) is accepted too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pipekit_train.core.adapter import ConfigError, OptimizerSpec, check_schedule, optimizer_spec

__all__ = [
    "attach_lr_scale",
    "build_optimizer",
    "check_optimizer_config",
    "build_schedule",
    "scaled_schedule",
    "set_lr_scale",
]


def build_schedule(spec: Mapping[str, Any], accumulate: int = 1) -> Any:
    """A `keras.optimizers.schedules.LearningRateSchedule` following core's schedule dict.

    The curve is `pipekit_train.core`'s `learning_rate_at(spec, step)` (the same for every
    backend), evaluated with `keras.ops` at the optimizer's update count (0 for the first
    update). Keras calls a schedule with its batch counter, so with gradient accumulation
    (`accumulate > 1`) the counter is divided by `accumulate` here.
    """
    import keras

    spec = check_schedule(spec)
    ops = keras.ops

    def cosine(init: float, end: float, t: Any, steps: int) -> Any:
        frac = ops.minimum(ops.maximum(t, 0.0), float(steps)) / float(steps)
        return end + (init - end) * 0.5 * (1.0 + ops.cos(math.pi * frac))

    class CoreSchedule(keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step: Any) -> Any:
            if accumulate > 1:
                step = ops.floor_divide(step, accumulate)
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
            return {**spec, "accumulate": accumulate}

    return CoreSchedule()


def scaled_schedule(inner: Any) -> Any:
    """A `LearningRateSchedule`: `inner(step) * scale` (`inner` a schedule or a number).

    `scale` is core's learning-rate scale, an optimizer variable that `attach_lr_scale`
    adds once the optimizer is built: inside Keras's compiled (stateless, on jax) train
    step it is read like the moments, so changing it never recompiles, and it is saved
    with the optimizer's variables in every checkpoint.
    """
    import keras

    ops = keras.ops

    class ScaledSchedule(keras.optimizers.schedules.LearningRateSchedule):
        def __init__(self) -> None:
            self.inner = inner
            self.scale: Any = None

        def __call__(self, step: Any) -> Any:
            if callable(self.inner):
                lr = ops.cast(self.inner(step), "float32")
            else:
                lr = ops.convert_to_tensor(float(self.inner), "float32")
            if self.scale is None:
                return lr
            return lr * ops.cast(self.scale, "float32")

        def get_config(self) -> dict[str, Any]:
            base = self.inner.get_config() if hasattr(self.inner, "get_config") else self.inner
            return {"inner": base, "lr_scale": True}

    return ScaledSchedule()


def attach_lr_scale(optimizer: Any) -> Any:
    """Add the scale variable (1.0) to a built optimizer whose rate is a `scaled_schedule`."""
    schedule: Any = getattr(optimizer, "_learning_rate", None)
    if getattr(schedule, "scale", False) is not None:
        raise ConfigError(  # pragma: no cover - build_optimizer(lr_scale=True) made it
            "The optimizer's learning rate is not a scaled schedule. Received: "
            f"{type(schedule).__name__}. Build it with build_optimizer(..., lr_scale=True)."
        )
    schedule.scale = optimizer.add_variable(
        shape=(), initializer="ones", dtype="float32", name="pipekit_lr_scale"
    )
    return schedule.scale


def set_lr_scale(optimizer: Any, scale: float) -> None:
    """Assign core's learning-rate scale (after `attach_lr_scale`)."""
    optimizer._learning_rate.scale.assign(float(scale))


def _keras_optimizer(spec: OptimizerSpec, lr: Any, accumulate: int) -> Any:
    import keras

    h = spec.hyper
    kwargs: dict[str, Any] = {"learning_rate": lr}
    if accumulate > 1:
        kwargs["gradient_accumulation_steps"] = accumulate
    if spec.weight_decay:
        kwargs["weight_decay"] = spec.weight_decay
    if spec.clip_norm is not None:
        kwargs["global_clipnorm"] = spec.clip_norm
    if spec.clip_value is not None:
        kwargs["clipvalue"] = spec.clip_value
    wrap: Any = lambda cls: cls  # noqa: E731
    if spec.ema is not None:  # core's convention, not Keras's own use_ema (see _ema.py)
        from ._ema import with_ema

        wrap, kwargs["ema"] = with_ema, spec.ema
    if spec.name in ("adam", "adamw"):
        cls = keras.optimizers.AdamW if spec.weight_decay else keras.optimizers.Adam
        return wrap(cls)(beta_1=h["b1"], beta_2=h["b2"], epsilon=h["eps"], **kwargs)
    if spec.name == "sgd":
        return wrap(keras.optimizers.SGD)(momentum=h["momentum"], nesterov=h["nesterov"], **kwargs)
    if spec.name == "rmsprop":
        return wrap(keras.optimizers.RMSprop)(
            rho=h["decay"],
            epsilon=h["eps"],
            momentum=h["momentum"],
            centered=h["centered"],
            **kwargs,
        )
    if spec.name == "adagrad":
        return wrap(keras.optimizers.Adagrad)(
            initial_accumulator_value=h["initial_accumulator_value"], epsilon=h["eps"], **kwargs
        )
    raise ConfigError(  # pragma: no cover - core's table and this one are kept in step
        f"The Keras adapter has no translation for optimizer {spec.name!r}."
    )


def build_optimizer(config: Any, *, accumulate: int = 1, lr_scale: bool = False) -> Any:
    """A new, unbuilt `keras.optimizers.Optimizer` from a dict config or a Keras optimizer.

    A Keras optimizer instance is cloned (`from_config(get_config())`) so every run
    starts from fresh optimizer state. `accumulate > 1`
    (`TrainingLoop(accumulate_grad_batches=k)`) sets Keras's `gradient_accumulation_steps`:
    one update averages k batches' gradients, and schedules follow the update count.
    `lr_scale` (plans with `ReduceLROnPlateau`): the rate becomes a `scaled_schedule`
    (call `attach_lr_scale` once the optimizer is built).

    Raises:
        ConfigError: an unknown optimizer or schedule name, or arguments the Keras
            class rejects.
    """
    import keras

    if isinstance(config, keras.optimizers.Optimizer):
        native = config.get_config()
        if accumulate > 1:
            native["gradient_accumulation_steps"] = accumulate
        if lr_scale:
            rate = native.get("learning_rate")
            if isinstance(rate, Mapping):
                rate = keras.optimizers.schedules.deserialize(rate)
            native["learning_rate"] = scaled_schedule(rate)
        return type(config).from_config(native)
    if not isinstance(config, Mapping):
        raise ConfigError(
            "`optimizer_config` must be a dict such as {'name': 'adam', 'lr': 1e-3} or a "
            f"`keras.optimizers.Optimizer`. Received: optimizer_config={config!r}."
        )
    spec = optimizer_spec(config)
    lr = (
        build_schedule(spec.learning_rate, accumulate)  # type: ignore[arg-type]  # `scheduled`: a schedule dict
        if spec.scheduled
        else spec.learning_rate
    )
    if lr_scale:
        lr = scaled_schedule(lr)
    return _keras_optimizer(spec, lr, accumulate)


def check_optimizer_config(config: Any) -> None:
    """Raise `ConfigError` now for a config `build_optimizer` would reject."""
    build_optimizer(config)
