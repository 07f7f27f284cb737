"""The canonical training spec: one meaning for every backend.

`optimizer_config` and `precision` are validated here, in core, and every adapter
translates the result to its framework. What a name means does not depend on the
backend:

| `name` | hyperparameters (defaults) |
|---|---|
| `adam` | `b1=0.9`, `b2=0.999`, `eps=1e-8`, `weight_decay=0.0` |
| `adamw` | `b1=0.9`, `b2=0.999`, `eps=1e-8`, `weight_decay=0.01` |
| `sgd` | `momentum=0.0`, `nesterov=False`, `weight_decay=0.0` |
| `rmsprop` | `decay=0.9`, `eps=1e-8`, `momentum=0.0`, `centered=False`, `weight_decay=0.0` |
| `adagrad` | `eps=1e-8`, `initial_accumulator_value=0.1`, `weight_decay=0.0` |

Every optimizer also takes `learning_rate` (a number or a schedule dict, see
`pipekit_train.core.spec.SCHEDULES`), `clip_norm` (clip the global gradient norm
before the update), `clip_value` (clip each gradient element) and `ema` (keep an
exponential moving average of the weights):

- `ema=decay` (or `{"decay": decay}`, `0 <= decay < 1`) keeps an exponential moving
  average of the trainable parameters: it starts from the initial weights and after
  every optimizer update becomes `decay * ema + (1 - decay) * weights` (one update per
  optimizer update with gradient accumulation, none for a skipped non-finite step).
  Layer state (BatchNorm statistics) is used as trained. Validation, best-k checkpoint
  selection, `artifact.model` and the registry use the averaged weights;
  `artifact.raw_model` holds the trained ones. The average is in every checkpoint.
- `weight_decay` is **decoupled** on every backend, as in AdamW: each update subtracts
  `learning_rate * weight_decay * param` besides the optimizer's own step. `adam` with
  `weight_decay` is therefore the same as `adamw`.
- Defaults are filled in here, so a backend's own defaults (Keras's `epsilon=1e-7`,
  torch's RMSprop `alpha=0.99`, optax's AdamW `weight_decay=1e-4`) never apply.
- Familiar spellings are accepted and renamed: `lr` → `learning_rate`,
  `betas=(b1, b2)`, `beta_1`/`beta_2` → `b1`/`b2`, `epsilon` → `eps`, `rho` → `decay`,
  `gradient_clip_norm` → `clip_norm`.

Precision has one vocabulary: `"float32"`, `"bfloat16-mixed"` (parameters in float32,
computation in bfloat16) and `"float16-mixed"` (the same with float16 and dynamic loss
scaling). Each adapter translates it (a jmp policy on Equinox, `"bf16-mixed"` on
Lightning, `"mixed_bfloat16"` on Keras) and still accepts its own unambiguous strings.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pipekit_train.core._errors import ConfigError

from ._policies import Precision
from ._schedules import check_schedule

__all__ = [
    "translate_precision",
    "OPTIMIZERS",
    "PRECISIONS",
    "OptimizerSpec",
    "canonical_precision",
    "optimizer_spec",
    "resolve_optimizer_config",
    "resolve_precision",
]

_COMMON: Final[dict[str, Any]] = {"weight_decay": 0.0, "clip_norm": None, "clip_value": None}

OPTIMIZERS: Final[dict[str, dict[str, Any]]] = {
    "adam": {"b1": 0.9, "b2": 0.999, "eps": 1e-8},
    "adamw": {"b1": 0.9, "b2": 0.999, "eps": 1e-8, "weight_decay": 0.01},
    "sgd": {"momentum": 0.0, "nesterov": False},
    "rmsprop": {"decay": 0.9, "eps": 1e-8, "momentum": 0.0, "centered": False},
    "adagrad": {"eps": 1e-8, "initial_accumulator_value": 0.1},
}
"""Optimizer name → its hyperparameters and their defaults (besides `learning_rate`,
`weight_decay`, `clip_norm` and `clip_value`, which every optimizer takes)."""

_ALIASES: Final[dict[str, str]] = {
    "lr": "learning_rate",
    "beta_1": "b1",
    "beta_2": "b2",
    "epsilon": "eps",
    "rho": "decay",
    "gradient_clip_norm": "clip_norm",
}

_DEFAULT_NAME: Final = "adam"
_DEFAULT_LR: Final = 1e-3

PRECISIONS: Final[tuple[str, ...]] = tuple(p.value for p in Precision)
"""The precision names every backend understands (the values of `Precision`)."""

_PRECISION_ALIASES: Final[dict[str, str]] = {
    "32": "float32",
    "32-true": "float32",
    "fp32": "float32",
    "f32": "float32",
    "bf16-mixed": "bfloat16-mixed",
    "mixed_bfloat16": "bfloat16-mixed",
    "16-mixed": "float16-mixed",
    "fp16-mixed": "float16-mixed",
    "mixed_float16": "float16-mixed",
}


@dataclass(frozen=True)
class OptimizerSpec:
    """A validated optimizer description, ready for an adapter to translate.

    Attributes:
        name: one of `OPTIMIZERS`.
        learning_rate: a positive number, or a checked schedule dict.
        hyper: the optimizer's hyperparameters with every default filled in.
        weight_decay: decoupled weight decay (0.0 for none).
        clip_norm: the global-norm clip, or None.
        clip_value: the element-wise clip, or None.
        ema: the decay of the moving average of the weights (see the module docstring), or None.
    """

    name: str
    learning_rate: float | dict[str, Any]
    hyper: dict[str, Any] = field(default_factory=dict)
    weight_decay: float = 0.0
    clip_norm: float | None = None
    clip_value: float | None = None
    ema: float | None = None

    @property
    def scheduled(self) -> bool:
        """Whether the learning rate follows a schedule."""
        return isinstance(self.learning_rate, Mapping)

    def to_config(self) -> dict[str, Any]:
        """The canonical JSON config (what the plan records)."""
        return {
            "name": self.name,
            "learning_rate": self.learning_rate,
            **self.hyper,
            "weight_decay": self.weight_decay,
            "clip_norm": self.clip_norm,
            "clip_value": self.clip_value,
            # only when set: a config without it keeps its canonical JSON (and digests)
            **({} if self.ema is None else {"ema": self.ema}),
        }


def _number(key: str, value: Any, *, positive: bool, allow_zero: bool = False) -> float:
    ok = (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and math.isfinite(value)
        and (value > 0 or (allow_zero and value == 0) or not positive)
    )
    if not ok:
        kind = "a non-negative" if allow_zero else "a positive" if positive else "a finite"
        raise ConfigError(
            f"`optimizer_config['{key}']` must be {kind} number. Received: {key}={value!r}."
        )
    return float(value)


def _renamed(config: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for key, value in config.items():
        if key == "betas":
            if not isinstance(value, (list, tuple)) or len(value) != 2:
                raise ConfigError(
                    f"`optimizer_config['betas']` must be a pair (b1, b2). Received: betas={value!r}."
                )
            pairs = [("b1", value[0]), ("b2", value[1])]
        else:
            pairs = [(_ALIASES.get(key, key), value)]
        for target, v in pairs:
            if target in out and out[target] != v:
                raise ConfigError(
                    f"`optimizer_config` sets `{target}` twice with different values. "
                    f"Received: {origin[target]}={out[target]!r}, {key}={value!r}. Pass only one."
                )
            out[target], origin[target] = v, key
    return out


def optimizer_spec(config: Mapping[str, Any] | None) -> OptimizerSpec:
    """Validate a dict optimizer config and return its `OptimizerSpec`.

    Args:
        config: e.g. `{"name": "adamw", "lr": 3e-4, "weight_decay": 0.05, "clip_norm": 1.0}`;
            None means `{"name": "adam", "learning_rate": 1e-3}`.

    Raises:
        ConfigError: an unknown name or key, or a bad value; the message names the field,
            the value and what is accepted.
    """
    cfg = _renamed(config or {})
    if "gradient_accumulation_steps" in cfg or "accumulate_grad_batches" in cfg:
        key = (
            "gradient_accumulation_steps"
            if "gradient_accumulation_steps" in cfg
            else "accumulate_grad_batches"
        )
        raise ConfigError(
            f"Gradient accumulation is not an optimizer option. Received: {key}={cfg[key]!r}. "
            "Use TrainingLoop(accumulate_grad_batches=k): every backend then makes one update "
            "from k batches of `batch_size`, and steps count updates."
        )
    name = cfg.pop("name", _DEFAULT_NAME)
    if not isinstance(name, str) or name.lower() not in OPTIMIZERS:
        raise ConfigError(
            f"`optimizer_config['name']` must be one of {sorted(OPTIMIZERS)} (the names every "
            f"backend runs the same way). Received: name={name!r}. For another optimizer pass "
            "the backend's own object (an optax transformation, a `params -> torch.optim` "
            "callable, a keras.optimizers.Optimizer)."
        )
    name = name.lower()
    defaults = {**OPTIMIZERS[name]}
    accepted = {"learning_rate", "ema", *_COMMON, *defaults}
    unknown = sorted(set(cfg) - accepted)
    if unknown:
        raise ConfigError(
            f"`optimizer_config` has keys the {name!r} optimizer does not take: {unknown}. "
            f"Received: {', '.join(f'{k}={cfg[k]!r}' for k in unknown)}. "
            f"Use some of {sorted(accepted)}."
        )
    lr = cfg.pop("learning_rate", _DEFAULT_LR)
    if isinstance(lr, Mapping):
        lr = check_schedule(lr)
    elif (
        isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0
    ):
        raise ConfigError(
            "`optimizer_config['learning_rate']` (or `lr`) must be a positive finite number or "
            f"a schedule dict. Received: learning_rate={lr!r}."
        )
    else:
        lr = float(lr)
    hyper: dict[str, Any] = {}
    for key, default in defaults.items():
        if key == "weight_decay":
            continue
        value = cfg.get(key, default)
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(
                    f"`optimizer_config['{key}']` must be True or False. Received: {key}={value!r}."
                )
            hyper[key] = value
        elif key in ("b1", "b2", "decay", "momentum"):
            value = _number(key, value, positive=True, allow_zero=True)
            if value >= 1:
                raise ConfigError(
                    f"`optimizer_config['{key}']` must be in [0, 1). Received: {key}={value!r}."
                )
            hyper[key] = value
        else:
            hyper[key] = _number(key, value, positive=True, allow_zero=key != "eps")
    if name == "sgd" and hyper["nesterov"] and hyper["momentum"] == 0:
        raise ConfigError(
            "`optimizer_config['nesterov']` needs a momentum. Received: nesterov=True, "
            "momentum=0.0. Set momentum (e.g. 0.9) or drop nesterov."
        )
    weight_decay = _number(
        "weight_decay",
        cfg.get("weight_decay", defaults.get("weight_decay", 0.0)),
        positive=True,
        allow_zero=True,
    )
    clips: dict[str, float | None] = {}
    for key in ("clip_norm", "clip_value"):
        value = cfg.get(key)
        clips[key] = None if value is None else _number(key, value, positive=True)
    if clips["clip_norm"] is not None and clips["clip_value"] is not None:
        raise ConfigError(
            "`optimizer_config` sets both `clip_norm` and `clip_value`; backends apply only one. "
            f"Received: clip_norm={clips['clip_norm']}, clip_value={clips['clip_value']}. Pass one."
        )
    ema = _ema_decay(cfg.get("ema"))
    return OptimizerSpec(
        name=name,
        learning_rate=lr,
        hyper=hyper,
        weight_decay=weight_decay,
        clip_norm=clips["clip_norm"],
        clip_value=clips["clip_value"],
        ema=ema,
    )


def _ema_decay(value: Any) -> float | None:
    """The decay of `optimizer_config['ema']` (a number or `{"decay": number}`), or None."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {"decay"})
        if unknown or "decay" not in value:
            raise ConfigError(
                "`optimizer_config['ema']` as a dict takes one key, `decay`. Received: "
                f"ema={dict(value)!r}. Use e.g. {{'decay': 0.999}} or just 0.999."
            )
        value = value["decay"]
    ok = (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and math.isfinite(value)
        and 0 <= value < 1
    )
    if not ok:
        raise ConfigError(
            f"`optimizer_config['ema']` is the decay of the moving average of the weights. "
            f"Received: ema={value!r}, but the decay must be in [0, 1). Use e.g. 0.999."
        )
    return float(value)


def resolve_optimizer_config(config: Any) -> Any:
    """The canonical dict of a dict optimizer config (every default filled in).

    Non-dict values (a backend-native optimizer object) are returned unchanged for the
    adapter to validate.

    Raises:
        ConfigError: see `optimizer_spec`.
    """
    if config is not None and not isinstance(config, Mapping):
        return config
    return optimizer_spec(config).to_config()


def resolve_precision(value: str | None, *, native: Mapping[str, str] | None = None) -> Precision:
    """The canonical `Precision` of `value`: every spelling is resolved here, once.

    Args:
        value: a canonical name (`PRECISIONS`, or a `Precision`), a common spelling
            (`"bf16-mixed"`, `"mixed_bfloat16"`, ...), or one of the backend's own names
            in `native`; None means float32.
        native: the backend's own names → canonical names.

    Raises:
        ConfigError: a name that is neither canonical nor known to the backend.
    """
    if value is None:
        return Precision.FLOAT32
    if isinstance(value, str):
        key = value.strip()
        if key in PRECISIONS:
            return Precision(key)
        if native and key in native:
            return Precision(native[key])
        if key in _PRECISION_ALIASES:
            return Precision(_PRECISION_ALIASES[key])
    known = sorted(set(PRECISIONS) | set(_PRECISION_ALIASES) | set(native or {}))
    raise ConfigError(
        f"`precision` must be one of {list(PRECISIONS)} (the names every backend accepts). "
        f"Received: precision={value!r}. This backend also accepts {known}."
    )


def canonical_precision(value: object) -> Precision | None:
    """The `Precision` a string names (canonical or a common spelling), else None.

    For adapters that also take framework-native names with no canonical meaning
    (a Keras `"bfloat16"` policy, a jmp policy string): those give None.
    """
    if isinstance(value, Precision):
        return value
    if not isinstance(value, str):
        return None
    key = value.strip()
    if key in PRECISIONS:
        return Precision(key)
    alias = _PRECISION_ALIASES.get(key)
    return None if alias is None else Precision(alias)


def translate_precision(
    value: Any,
    table: Mapping[Precision, Any],
    native: Collection[Any],
    *,
    backend: str,
    hint: str = "",
) -> tuple[Any, Precision | None]:
    """`(the framework's precision value, its canonical Precision)` of an adapter's
    `precision=` argument: the one translation every adapter shares.

    A canonical name maps through `table`; one of the framework's own names (`native`)
    is kept as it is (its canonical precision is None when it has none, e.g. Lightning's
    `"bf16-true"`); another spelling core knows (`"bf16-mixed"`, `"fp32"`) maps like its
    canonical name.

    Args:
        value: what the user passed.
        table: each canonical `Precision` → the framework's value for it.
        native: the framework's own precision values, accepted as they are.
        backend: the framework's name, for the message (e.g. `"a Keras dtype policy"`).
        hint: a sentence appended to the error.

    Raises:
        ConfigError: none of these.
    """
    if isinstance(value, str) and value in set(Precision):
        return table[Precision(value)], Precision(value)
    if value in native:
        return value, canonical_precision(value)
    canonical = canonical_precision(value)
    if canonical is not None:
        return table[canonical], canonical
    shown = sorted(map(str, native))
    raise ConfigError(
        f"`precision` must be one of {[p.value for p in Precision]} (the same on every "
        f"backend) or {backend} {shown}. Received: precision={value!r}.{' ' + hint if hint else ''}"
    )
