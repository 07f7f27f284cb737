"""Torch optimizers and learning-rate schedules from core's optimizer config.

`optimizer_config` (normalised by core: `lr` → `learning_rate`) names a torch optimizer
and its keyword arguments; optax spellings are accepted too (`b1`/`b2` → `betas`,
`decay` → RMSprop's `alpha`) so one config runs on every backend. `learning_rate` is a
number or a schedule dict validated by core (`pipekit_train.core._schedules`, the same
curves as optax's); a schedule becomes a `LambdaLR` over an optimizer whose base
learning rate is 1.0, evaluating core's `learning_rate_at`, so the schedule's value
*is* the learning rate and the scheduler state is plain JSON. `clip_norm` clips the
global gradient norm.

A backend-native optimizer is a callable `params -> torch.optim.Optimizer`, e.g.
`functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9)`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pipekit_train.core import ConfigError

__all__ = [
    "OPTIMIZERS",
    "build_optimizer",
    "check_optimizer_config",
    "clip_norm_of",
    "schedule_fn",
]

# name -> torch.optim class name
OPTIMIZERS: dict[str, str] = {
    "adadelta": "Adadelta",
    "adagrad": "Adagrad",
    "adam": "Adam",
    "adamax": "Adamax",
    "adamw": "AdamW",
    "asgd": "ASGD",
    "nadam": "NAdam",
    "radam": "RAdam",
    "rmsprop": "RMSprop",
    "rprop": "Rprop",
    "sgd": "SGD",
}

_COMMON_KEYS = ("name", "learning_rate", "clip_norm", "gradient_clip_norm")


def _torch_optimizer_class(name: str) -> Any:
    import torch

    return getattr(torch.optim, OPTIMIZERS[name])


def _accepted_keys(name: str) -> list[str]:
    cls = _torch_optimizer_class(name)
    params = [p for p in inspect.signature(cls).parameters if p not in ("params", "lr", "self")]
    if "betas" in params:
        params += ["b1", "b2"]
    if name == "rmsprop":
        params.append("decay")
    return sorted(set(params) | set(_COMMON_KEYS))


def check_optimizer_config(config: Any, total_steps: int | None = None) -> None:
    """Raise `ConfigError` unless the config builds a torch optimizer.

    Args:
        config: core's normalised optimizer config, or a callable `params -> Optimizer`.
        total_steps: the run length (unused by core's schedules, which carry their own).
    """
    if not isinstance(config, Mapping):
        if callable(config):
            return
        raise ConfigError(
            "`optimizer_config` must be a dict such as {'name': 'adam', 'lr': 1e-3} or a callable "
            f"`params -> torch.optim.Optimizer`. Received: optimizer_config={config!r}."
        )
    name = config.get("name", "adam")
    if name not in OPTIMIZERS:
        raise ConfigError(
            f"`optimizer_config['name']` must be one of {sorted(OPTIMIZERS)} for the Lightning "
            f"backend. Received: name={name!r}. Pick a known optimizer name."
        )
    accepted = _accepted_keys(name)
    unknown = sorted(set(config) - set(accepted))
    if unknown:
        raise ConfigError(
            f"`optimizer_config` has keys the {name!r} optimizer does not take: {unknown}. "
            f"Received: optimizer_config={dict(config)!r}. Use some of {accepted}."
        )
    if "betas" in config and ("b1" in config or "b2" in config):
        raise ConfigError(
            f"`optimizer_config` sets both `betas` and `b1`/`b2`. Received: {dict(config)!r}. Pass one form."
        )
    if "decay" in config and "alpha" in config:
        raise ConfigError(
            f"`optimizer_config` sets both `decay` and `alpha` (the same RMSprop argument). Received: {dict(config)!r}."
        )
    try:
        import torch

        probe = torch.nn.Parameter(torch.zeros(1))
        build_optimizer(config, [probe], total_steps=total_steps or 1)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"`optimizer_config` is not valid for torch.optim.{OPTIMIZERS[name]}: {exc}. "
            f"Received: optimizer_config={dict(config)!r}."
        ) from exc


def clip_norm_of(config: Any) -> float | None:
    """The gradient-norm clip of a config, if any."""
    if not isinstance(config, Mapping):
        return None
    clip = config.get("clip_norm", config.get("gradient_clip_norm"))
    return None if clip is None else float(clip)


def schedule_fn(spec: Mapping[str, Any]) -> Callable[[int], float]:
    """The learning rate of update number `count` (0-based), from core's schedule table."""
    from pipekit_train.core._schedules import check_schedule, learning_rate_at

    filled = check_schedule(spec)
    cache: dict[int, float] = {}

    def lr_at(count: int) -> float:
        value = cache.get(count)
        if value is None:
            if len(cache) > 4:
                cache.clear()
            value = cache[count] = learning_rate_at(filled, count)
        return value

    return lr_at


def build_optimizer(
    config: Any, params: Iterable[Any], *, total_steps: int | None
) -> tuple[Any, Any]:
    """Build `(optimizer, scheduler or None)` over `params`.

    Args:
        config: a normalised optimizer config dict, or a callable `params -> Optimizer`.
        params: the parameters (or parameter groups) to optimize.
        total_steps: the run length (kept for custom builders; core schedules carry theirs).
    """
    import torch

    params = list(params)
    if not isinstance(config, Mapping):
        optimizer = config(params)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(
                "A callable `optimizer_config` must return a torch.optim.Optimizer. "
                f"Received: {type(optimizer).__name__}."
            )
        return optimizer, None
    name = config.get("name", "adam")
    kwargs = {k: v for k, v in config.items() if k not in _COMMON_KEYS}
    if "b1" in kwargs or "b2" in kwargs:
        defaults = inspect.signature(_torch_optimizer_class(name)).parameters["betas"].default
        kwargs["betas"] = (
            float(kwargs.pop("b1", defaults[0])),
            float(kwargs.pop("b2", defaults[1])),
        )
    elif isinstance(kwargs.get("betas"), list):
        kwargs["betas"] = tuple(kwargs["betas"])
    if "decay" in kwargs:
        kwargs["alpha"] = kwargs.pop("decay")
    lr = config.get("learning_rate", 1e-3)
    schedule = None
    if isinstance(lr, Mapping):
        schedule = schedule_fn(lr)
        kwargs["lr"] = 1.0
    else:
        kwargs["lr"] = float(lr)
    optimizer = _torch_optimizer_class(name)(params, **kwargs)
    # a plain function (not a callable object) keeps LambdaLR's state dict pure JSON
    scheduler = None if schedule is None else torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    return optimizer, scheduler
