"""Learning-rate schedules from JSON, one definition for every backend.

`optimizer_config["learning_rate"]` may be a number or a schedule dict; this module
validates the dict (at `TrainingLoop` construction) and evaluates it in plain Python
(`learning_rate_at`), so the Lightning and Keras adapters follow exactly the same curve
as optax's built-in schedules used by the Equinox adapter.

| `schedule` | keys (defaults) | value at step t |
|---|---|---|
| `constant` | `value` | `value` |
| `cosine` | `init_value`, `decay_steps`, `alpha=0` | `init·((1−α)·½(1+cos(π·min(t,T)/T)) + α)` |
| `warmup_cosine` | `peak_value`, `warmup_steps`, `decay_steps`, `init_value=0`, `end_value=0` | linear warm-up to peak, then cosine from peak to end over `decay_steps − warmup_steps` |
| `exponential` | `init_value`, `transition_steps`, `decay_rate`, `staircase=False`, `end_value=None` | `init·rate^(t/T)` (floored with staircase; clipped at end_value) |
| `linear` | `init_value`, `end_value`, `transition_steps` | linear from init to end over T steps, then end |
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pipekit_train.core._errors import ConfigError

__all__ = ["SCHEDULES", "check_schedule", "learning_rate_at", "peak_learning_rate"]

SCHEDULES: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "constant": (("value",), {}),
    "cosine": (("init_value", "decay_steps"), {"alpha": 0.0}),
    "warmup_cosine": (
        ("peak_value", "warmup_steps", "decay_steps"),
        {"init_value": 0.0, "end_value": 0.0},
    ),
    "exponential": (
        ("init_value", "transition_steps", "decay_rate"),
        {"staircase": False, "end_value": None},
    ),
    "linear": (("init_value", "end_value", "transition_steps"), {}),
}


def check_schedule(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a schedule dict and return it with defaults filled in."""
    name = spec.get("schedule")
    if name not in SCHEDULES:
        raise ConfigError(
            f"`learning_rate['schedule']` must be one of {sorted(SCHEDULES)}. Received: schedule={name!r}."
        )
    required, defaults = SCHEDULES[name]
    missing = [k for k in required if k not in spec]
    unknown = sorted(set(spec) - {"schedule", *required, *defaults})
    if missing or unknown:
        raise ConfigError(
            f"The {name!r} schedule takes {list(required)} (and optionally {sorted(defaults)}). "
            f"Received: missing={missing}, unknown={unknown}."
        )
    out = {**defaults, **dict(spec)}
    for key in ("decay_steps", "warmup_steps", "transition_steps"):
        if key in out and (
            isinstance(out[key], bool)
            or not isinstance(out[key], int)
            or out[key] < (0 if key == "warmup_steps" else 1)
        ):
            raise ConfigError(
                f"`learning_rate['{key}']` must be a positive int. Received: {key}={out[key]!r}."
            )
    for key in ("value", "init_value", "peak_value", "decay_rate"):
        if key in out and (
            isinstance(out[key], bool)
            or not isinstance(out[key], (int, float))
            or not math.isfinite(out[key])
            or out[key] < 0
        ):
            raise ConfigError(
                f"`learning_rate['{key}']` must be a non-negative number. Received: {key}={out[key]!r}."
            )
    if name == "warmup_cosine" and out["warmup_steps"] >= out["decay_steps"]:
        raise ConfigError(
            "`warmup_steps` must be smaller than `decay_steps` (the total length, as in optax). "
            f"Received: warmup_steps={out['warmup_steps']}, decay_steps={out['decay_steps']}."
        )
    return out


def _cosine(init: float, end: float, t: int, steps: int) -> float:
    frac = min(max(t, 0), steps) / steps
    return end + (init - end) * 0.5 * (1.0 + math.cos(math.pi * frac))


def learning_rate_at(spec: Mapping[str, Any] | float, step: int) -> float:
    """The learning rate at optimizer step `step` (0-based: the rate of the first update)."""
    if not isinstance(spec, Mapping):
        return float(spec)
    s = check_schedule(spec)
    name = s["schedule"]
    if name == "constant":
        return float(s["value"])
    if name == "cosine":
        init, alpha = float(s["init_value"]), float(s["alpha"])
        return init * ((1 - alpha) * _cosine(1.0, 0.0, step, s["decay_steps"]) + alpha)
    if name == "warmup_cosine":
        warm = s["warmup_steps"]
        if step < warm:
            return (
                float(s["init_value"])
                + (float(s["peak_value"]) - float(s["init_value"])) * step / warm
            )
        return _cosine(
            float(s["peak_value"]), float(s["end_value"]), step - warm, s["decay_steps"] - warm
        )
    if name == "exponential":
        p = step / s["transition_steps"]
        if s["staircase"]:
            p = math.floor(p)
        value = float(s["init_value"]) * float(s["decay_rate"]) ** p
        end = s["end_value"]
        if end is not None:
            value = max(value, end) if s["decay_rate"] < 1 else min(value, end)
        return value
    frac = min(step, s["transition_steps"]) / s["transition_steps"]
    return float(s["init_value"]) + (float(s["end_value"]) - float(s["init_value"])) * frac


def peak_learning_rate(spec: Mapping[str, Any] | float) -> float:
    """The largest value a schedule takes (the base rate for multiplicative schedulers)."""
    if not isinstance(spec, Mapping):
        return float(spec)
    s = check_schedule(spec)
    if s["schedule"] == "constant":
        return float(s["value"])
    if s["schedule"] == "warmup_cosine":
        return max(float(s["peak_value"]), float(s["init_value"]), float(s["end_value"]))
    return max(float(s["init_value"]), float(s.get("end_value") or 0.0))
