"""Torch optimizers and schedules from the canonical optimizer spec.

Core validates `optimizer_config` and fills in every default
(`pipekit_train.core.adapter.optimizer_spec`); this module translates it:

| spec | torch |
|---|---|
| `adam` / `adamw` | `torch.optim.Adam` / `AdamW` (`betas=(b1, b2)`, `eps`); `weight_decay` decoupled (AdamW) |
| `sgd` | `torch.optim.SGD(momentum, nesterov)` |
| `rmsprop` | `torch.optim.RMSprop(alpha=decay, eps, momentum, centered)` |
| `adagrad` | `torch.optim.Adagrad(initial_accumulator_value, eps)` |
| `weight_decay` | decoupled on every optimizer: `param -= lr * wd * param` before the update (torch's own `weight_decay` argument, a coupled L2 term, is never used) |
| `clip_norm` / `clip_value` | Lightning's `gradient_clip_val` with `"norm"` / `"value"` |
| schedules | a `LambdaLR` over base rate 1.0 evaluating core's `learning_rate_at` |
| `ema` | `with_ema` (`_ema.py`): the average in the optimizer's state, updated by `step()` |
| core's learning-rate scale | the `LambdaLR`'s base rates (`_lr_scale.apply_lr_scale`) |

The schedule's value *is* the learning rate and the scheduler's state is plain JSON.
A backend-native optimizer is a callable `params -> torch.optim.Optimizer`, e.g.
`functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import cache
from typing import Any

from pipekit_train.core.adapter import (
    ConfigError,
    OptimizerSpec,
    check_schedule,
    learning_rate_at,
    optimizer_spec,
)

__all__ = ["build_optimizer", "check_optimizer_config", "gradient_clip", "build_schedule"]


def check_optimizer_config(config: Any, total_steps: int | None = None) -> None:
    """Raise `ConfigError` unless the config builds a torch optimizer.

    Args:
        config: core's canonical optimizer config, or a callable `params -> Optimizer`.
        total_steps: the run length (unused by core's schedules, which carry their own).
    """
    if not isinstance(config, Mapping):
        if callable(config):
            return
        raise ConfigError(
            "`optimizer_config` must be a dict such as {'name': 'adam', 'lr': 1e-3} or a callable "
            f"`params -> torch.optim.Optimizer`. Received: optimizer_config={config!r}."
        )
    optimizer_spec(config)


def gradient_clip(config: Any) -> tuple[float, str] | None:
    """`(gradient_clip_val, gradient_clip_algorithm)` of a config, if it clips."""
    if not isinstance(config, Mapping):
        return None
    spec = optimizer_spec(config)
    if spec.clip_norm is not None:
        return spec.clip_norm, "norm"
    if spec.clip_value is not None:
        return spec.clip_value, "value"
    return None


def build_schedule(spec: Mapping[str, Any]) -> Callable[[int], float]:
    """The learning rate of update number `count` (0-based), from core's schedule table."""
    filled = check_schedule(spec)
    cache_: dict[int, float] = {}

    def lr_at(count: int) -> float:
        value = cache_.get(count)
        if value is None:
            if len(cache_) > 4:
                cache_.clear()
            value = cache_[count] = learning_rate_at(filled, count)
        return value

    return lr_at


@cache
def _decoupled(base: type) -> type:
    """`base` with AdamW-style decoupled weight decay applied before every update."""

    class Decoupled(base):
        def __init__(self, params: Any, *, decoupled_weight_decay: float, **kwargs: Any):
            super().__init__(params, **kwargs)
            for group in self.param_groups:
                group.setdefault("decoupled_weight_decay", decoupled_weight_decay)

        def step(self, closure: Any = None) -> Any:
            import torch

            loss = None
            if closure is not None:  # gradients first, at the undecayed parameters
                with torch.enable_grad():
                    loss = closure()
            with torch.no_grad():
                for group in self.param_groups:
                    decay = group["decoupled_weight_decay"] * group["lr"]
                    if decay:
                        for p in group["params"]:
                            if p.grad is not None:
                                p.mul_(1.0 - decay)
            super().step()
            return loss

    Decoupled.__name__ = Decoupled.__qualname__ = f"Decoupled{base.__name__}"
    return Decoupled


def _torch_optimizer(
    spec: OptimizerSpec,
    params: list[Any],
    lr: float,
    fused: bool = False,
    capturable: bool = False,
) -> Any:
    import torch

    h, wd = spec.hyper, spec.weight_decay
    if fused and spec.name != "rmsprop":  # torch has no fused RMSprop
        return _fused_optimizer(spec, params, lr)
    if spec.name in ("adam", "adamw"):
        cls: Callable[..., Any] = torch.optim.AdamW if wd else torch.optim.Adam
        kwargs: dict[str, Any] = {"betas": (h["b1"], h["b2"]), "eps": h["eps"]}
        if capturable:  # runs inside a CUDA graph: step count and rate on the device
            kwargs["capturable"] = True
        if wd:
            kwargs["weight_decay"] = wd
        return cls(params, lr=lr, **kwargs)
    if spec.name == "sgd":
        cls, kwargs = torch.optim.SGD, {"momentum": h["momentum"], "nesterov": h["nesterov"]}
    elif spec.name == "rmsprop":
        cls, kwargs = (
            torch.optim.RMSprop,
            {
                "alpha": h["decay"],
                "eps": h["eps"],
                "momentum": h["momentum"],
                "centered": h["centered"],
            },
        )
    elif spec.name == "adagrad":
        cls, kwargs = (
            torch.optim.Adagrad,
            {"initial_accumulator_value": h["initial_accumulator_value"], "eps": h["eps"]},
        )
    else:  # pragma: no cover - core's table and this one are kept in step
        raise ConfigError(f"The Lightning adapter has no translation for {spec.name!r}.")
    if wd:
        return _decoupled(cls)(params, lr=lr, decoupled_weight_decay=wd, **kwargs)
    return cls(params, lr=lr, **kwargs)


def _fused_optimizer(spec: OptimizerSpec, params: list[Any], lr: float) -> Any:
    """The spec with torch's fused kernels (`fused=True`): one kernel per update.

    Decoupled weight decay is applied by the `_decoupled` wrapper (AdamW's own for adam),
    exactly as in the for-loop build; the fused kernels agree with it to float rounding.
    """
    import torch

    h, wd = spec.hyper, spec.weight_decay
    if spec.name in ("adam", "adamw"):
        cls: Callable[..., Any] = torch.optim.AdamW if wd else torch.optim.Adam
        kwargs: dict[str, Any] = {"betas": (h["b1"], h["b2"]), "eps": h["eps"], "fused": True}
        if wd:
            kwargs["weight_decay"] = wd
        return cls(params, lr=lr, **kwargs)
    if spec.name == "sgd":
        cls, kwargs = (
            torch.optim.SGD,
            {"momentum": h["momentum"], "nesterov": h["nesterov"], "fused": True},
        )
    else:
        cls, kwargs = (
            torch.optim.Adagrad,
            {
                "initial_accumulator_value": h["initial_accumulator_value"],
                "eps": h["eps"],
                "fused": True,
            },
        )
    if wd:
        return _decoupled(cls)(params, lr=lr, decoupled_weight_decay=wd, **kwargs)
    return cls(params, lr=lr, **kwargs)


def build_optimizer(
    config: Any,
    params: Iterable[Any],
    *,
    total_steps: int | None,
    fused: bool = False,
    lr_scale: bool = False,
    capturable: bool = False,
) -> tuple[Any, Any]:
    """Build `(optimizer, scheduler or None)` over `params`.

    Args:
        config: core's canonical config dict, or a callable `params -> Optimizer`.
        params: the parameters (or parameter groups) to optimize.
        total_steps: the run length (kept for custom builders; core schedules carry theirs).
        fused: use torch's fused optimizer kernel where it has one (not for rmsprop or a
            callable config); it agrees with the default build to float rounding.
        lr_scale: always return a step-interval `LambdaLR` (a constant rate and a callable
            config included), whose base rates carry core's learning-rate scale
            (`apply_lr_scale`; plans with `ReduceLROnPlateau`).
        capturable: build torch's capturable Adam/AdamW, whose step runs inside a CUDA
            graph (`Torch(compile="cuda-graphs")`; `CAPTURABLE_OPTIMIZERS`).
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
        if lr_scale:
            from ._lr_scale import unit_rate

            return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, unit_rate)
        return optimizer, None
    spec = optimizer_spec(config)
    schedule = build_schedule(spec.learning_rate) if spec.scheduled else None  # type: ignore[arg-type]  # `scheduled`: a schedule dict
    if schedule is None and lr_scale:
        schedule = build_schedule({"schedule": "constant", "value": float(spec.learning_rate)})  # type: ignore[arg-type]  # not `scheduled`: a float
    lr = 1.0 if schedule is not None else float(spec.learning_rate)  # type: ignore[arg-type]  # not `scheduled`: a float
    optimizer = _torch_optimizer(spec, params, lr, fused=fused, capturable=capturable)
    if spec.ema is not None:  # before the scheduler, which wraps `optimizer.step`
        from ._ema import with_ema

        with_ema(optimizer, spec.ema)
    # a plain function (not a callable object) keeps LambdaLR's state dict pure JSON
    scheduler = None if schedule is None else torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    return optimizer, scheduler
