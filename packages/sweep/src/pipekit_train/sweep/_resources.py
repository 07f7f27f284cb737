"""What one trial may use: Ray resources per trial, and device slots of the process executor.

`check_resources` validates the Ray executor's `resources_per_trial` (the Ray task
options `num_cpus`, `num_gpus`, `memory`, `resources`, `accelerator_type`) and
`trials_that_fit` counts how many such trials a Ray cluster can run at once.
`check_devices` validates the process executor's `devices` and turns each device into
the environment its worker processes get (`CUDA_VISIBLE_DEVICES`, ...).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from pipekit_train.core import ConfigError

__all__ = [
    "RESOURCE_KEYS",
    "Device",
    "check_devices",
    "check_resources",
    "jax_memory_defaults",
    "trials_that_fit",
]

#: The keys `resources_per_trial` accepts (Ray task options).
RESOURCE_KEYS = ("num_cpus", "num_gpus", "memory", "resources", "accelerator_type")
_RAY_NAMES = {"num_cpus": "CPU", "num_gpus": "GPU", "memory": "memory"}
_RESERVED = ("CPU", "GPU", "memory", "object_store_memory")
_UNIT = 10_000  # Ray counts resources in units of 0.0001
#: JAX preallocates this fraction of a GPU's memory by default.
_JAX_DEFAULT_FRACTION = 0.75
_JAX_MEMORY_VARS = (
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
)


def _amount(value: Any, where: str, given: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(
            f"`{where}` must be a number. Received: {where}={value!r} in "
            f"resources_per_trial={given!r}."
        )
    if value < 0:
        raise ConfigError(
            f"`{where}` cannot be negative. Received: {where}={value!r} in "
            f"resources_per_trial={given!r}. Use 0 for none."
        )
    if value and round(value * _UNIT) == 0:
        raise ConfigError(
            f"Ray counts resources in steps of 0.0001. Received: {where}={value!r} in "
            f"resources_per_trial={given!r}. Use 0 or at least 0.0001."
        )
    return value


def check_resources(resources_per_trial: Mapping[str, Any] | None) -> dict[str, Any]:
    """The Ray task options for one trial, validated; `num_cpus` defaults to 1.

    Args:
        resources_per_trial: `num_cpus` and `num_gpus` (numbers; a fraction of a GPU
            below 1 lets trials share it, more than one GPU must be a whole number),
            `memory` (bytes), `resources` (custom resources: `{"name": amount}`) and
            `accelerator_type` (e.g. `"H100"`). None: one CPU per trial.

    Raises:
        ConfigError: an unknown key, or a negative, non-numeric or impossible amount.
    """
    if resources_per_trial is None:
        return {"num_cpus": 1}
    given = resources_per_trial
    if not isinstance(given, Mapping):
        raise ConfigError(
            "`resources_per_trial` must be a dict such as {'num_cpus': 1, 'num_gpus': 0.5}. "
            f"Received: resources_per_trial={given!r}."
        )
    unknown = sorted(str(k) for k in given if k not in RESOURCE_KEYS)
    if unknown:
        raise ConfigError(
            f"Unknown key(s) {unknown} in `resources_per_trial`. Received: "
            f"resources_per_trial={dict(given)!r}. Known: {list(RESOURCE_KEYS)}; custom Ray "
            "resources go under 'resources', e.g. {'resources': {'bigmem': 1}}."
        )
    options: dict[str, Any] = {"num_cpus": 1}
    for key in ("num_cpus", "num_gpus", "memory"):
        if key in given:
            options[key] = _amount(given[key], key, dict(given))
    gpus = options.get("num_gpus", 0)
    if gpus > 1 and gpus != int(gpus):
        raise ConfigError(
            f"`num_gpus` above 1 must be a whole number of GPUs. Received: num_gpus={gpus!r}. "
            "A fraction (0 < num_gpus < 1) shares one GPU between trials; use "
            f"num_gpus={math.ceil(gpus)} for a trial that needs more than one."
        )
    if "resources" in given:
        custom = given["resources"]
        if not isinstance(custom, Mapping):
            raise ConfigError(
                "`resources_per_trial['resources']` must map custom resource names to amounts. "
                f"Received: resources={custom!r}."
            )
        checked = {}
        for name, value in custom.items():
            if not isinstance(name, str) or not name:
                raise ConfigError(
                    f"Custom resource names must be non-empty strings. Received: {name!r} in "
                    f"resources={dict(custom)!r}."
                )
            if name in _RESERVED:
                raise ConfigError(
                    f"`{name}` is not a custom resource. Received: resources={dict(custom)!r}. "
                    "Use 'num_cpus', 'num_gpus' or 'memory' in resources_per_trial instead."
                )
            checked[name] = _amount(value, f"resources[{name!r}]", dict(given))
        options["resources"] = checked
    if "accelerator_type" in given:
        kind = given["accelerator_type"]
        if not isinstance(kind, str) or not kind:
            raise ConfigError(
                "`accelerator_type` must name an accelerator such as 'H100'. Received: "
                f"accelerator_type={kind!r}."
            )
        if not gpus:
            raise ConfigError(
                f"`accelerator_type` selects a GPU type, so the trial must ask for a GPU. "
                f"Received: accelerator_type={kind!r} without num_gpus. Add num_gpus=1 "
                "(or a fraction)."
            )
        options["accelerator_type"] = kind
    return options


def demand(options: Mapping[str, Any]) -> dict[str, int]:
    """The Ray resources one trial takes, by Ray's resource names, in units of 0.0001."""
    out = {}
    for key, name in _RAY_NAMES.items():
        value = options.get(key, 0)
        if value:
            out[name] = round(value * _UNIT)
    for name, value in options.get("resources", {}).items():
        if value:
            out[name] = round(value * _UNIT)
    if options.get("accelerator_type"):
        out[f"accelerator_type:{options['accelerator_type']}"] = 10  # Ray asks for 0.001
    return out


def trials_that_fit(options: Mapping[str, Any], nodes: Sequence[Mapping[str, float]]) -> int | None:
    """How many trials with `options` the nodes (each a dict of its total resources) run at once.

    Each node runs as many as its scarcest requested resource allows; None when the
    trial requests nothing (then only `max_concurrent` limits the trials).
    """
    need = demand(options)
    if not need:
        return None
    total = 0
    for node in nodes:
        have = {name: round(float(amount) * _UNIT) for name, amount in node.items()}
        total += min(have.get(name, 0) // amount for name, amount in need.items())
    return total


def jax_memory_defaults(share: float) -> dict[str, str]:
    """`XLA_PYTHON_CLIENT_MEM_FRACTION` for a trial that gets `share` of one GPU.

    JAX preallocates 75% of a GPU's memory in each process, so two JAX trials on one GPU
    would run out of memory. A trial with a fraction of a GPU preallocates that fraction
    of 75% instead. Empty (nothing to set) for a whole GPU or more, or when the
    environment already sets any of JAX's memory variables.
    """
    if not 0 < share < 1 or any(var in os.environ for var in _JAX_MEMORY_VARS):
        return {}
    return {"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{_JAX_DEFAULT_FRACTION * share:.4g}"}


class Device:
    """One device of the process executor: a label and the environment of its workers."""

    def __init__(self, label: str, env: Mapping[str, str]):
        self.label = label
        self.env = dict(env)

    def __repr__(self) -> str:
        return f"Device({self.label!r}, env={self.env!r})"


def _device(spec: Any, index: int) -> Device:
    where = f"devices[{index}]"
    if isinstance(spec, Mapping):
        bad = [k for k, v in spec.items() if not isinstance(k, str) or not isinstance(v, str)]
        if not spec or bad:
            raise ConfigError(
                f"`{where}` as a dict must map environment variable names to string values, "
                f"e.g. {{'HIP_VISIBLE_DEVICES': '0'}}. Received: {where}={spec!r}."
            )
        label = ",".join(f"{k}={v}" for k, v in spec.items())
        return Device(label, spec)
    if not isinstance(spec, str):
        raise ConfigError(
            f"`{where}` must be a device such as 'cuda:0', 'cuda:0,1' or 'cpu', or a dict of "
            f"environment variables. Received: {where}={spec!r}."
        )
    text = spec.strip().lower()
    if text == "cpu":
        return Device("cpu", {"CUDA_VISIBLE_DEVICES": ""})
    kind, _, ids = text.partition(":")
    parts = [p.strip() for p in ids.split(",")]
    if kind != "cuda" or not all(p.isdigit() for p in parts):
        raise ConfigError(
            f"`{where}` must be 'cuda:<index>' (several GPUs for one trial: 'cuda:0,1') or "
            f"'cpu'. Received: {where}={spec!r}."
        )
    if len(set(parts)) != len(parts):
        raise ConfigError(f"`{where}` names a GPU twice. Received: {where}={spec!r}.")
    visible = ",".join(str(int(p)) for p in parts)
    return Device(f"cuda:{visible}", {"CUDA_VISIBLE_DEVICES": visible})


def check_devices(devices: Any, trials_per_device: Any) -> list[Device]:
    """The process executor's devices, validated, each with its workers' environment.

    Args:
        devices: None (no device assignment), or a list of `"cuda:<i>"` (one GPU per
            trial), `"cuda:<i>,<j>"` (several GPUs per trial), `"cpu"` (GPUs hidden) or a
            dict of environment variables (e.g. `{"HIP_VISIBLE_DEVICES": "0"}`).
        trials_per_device: how many trials share one device at a time (a positive int).

    Raises:
        ConfigError: a malformed device, a GPU named in two devices, or a bad count.
    """
    if isinstance(trials_per_device, bool) or not isinstance(trials_per_device, int):
        raise ConfigError(
            "`trials_per_device` must be a positive int. Received: "
            f"trials_per_device={trials_per_device!r}."
        )
    if trials_per_device < 1:
        raise ConfigError(
            "`trials_per_device` must be at least 1. Received: "
            f"trials_per_device={trials_per_device}."
        )
    if devices is None:
        if trials_per_device != 1:
            raise ConfigError(
                "`trials_per_device` needs `devices`. Received: "
                f"trials_per_device={trials_per_device}, devices=None. Pass e.g. "
                "devices=['cuda:0', 'cuda:1'], or max_concurrent to the sweep for plain workers."
            )
        return []
    if isinstance(devices, (str, bytes, Mapping)) or not isinstance(devices, Sequence):
        raise ConfigError(
            f"`devices` must be a list such as ['cuda:0', 'cuda:1']. Received: devices={devices!r}."
        )
    if not devices:
        raise ConfigError("`devices` is empty. Received: devices=[]. Give at least one device.")
    out = [_device(spec, i) for i, spec in enumerate(devices)]
    seen: dict[str, str] = {}
    for device in out:
        gpus = device.env.get("CUDA_VISIBLE_DEVICES", "")
        for gpu in filter(None, gpus.split(",")):
            if gpu in seen:
                raise ConfigError(
                    f"GPU {gpu} is in two devices ({seen[gpu]!r} and {device.label!r}). "
                    f"Received: devices={list(devices)!r}. List each GPU once; use "
                    "trials_per_device to run several trials on it."
                )
            seen[gpu] = device.label
    labels = [d.label for d in out]
    if len(set(labels)) != len(labels):
        raise ConfigError(
            f"A device is listed twice. Received: devices={list(devices)!r}. List each once; "
            "use trials_per_device to run several trials on it."
        )
    return out
