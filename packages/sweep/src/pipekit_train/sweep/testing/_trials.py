"""Importable trial functions: `trial(params, *, trial_dir) -> TrainingLoop`."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pipekit_train.core import Checkpoint, ConfigError, TrainingLoop

__all__ = ["backend_trial", "numpy_trial"]

_COMMON = {
    "lr": 1e-2,
    "batch_size": 32,
    "max_steps": 40,
    "seed": 0,
    "optimizer": "adam",
    "validate_every": 10,
    "checkpoint_every": None,
    "fail": False,
    "crash": False,
    "sleep": 0.0,
    "n_train": 256,
    "on_nonfinite": "stop",
}


def _options(params: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    known = {**_COMMON, **extra}
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ConfigError(
            f"Unknown trial parameters {unknown}. Received: params={params}. Known: {sorted(known)}."
        )
    return {**known, **params}


def _loop(
    model: Any, opts: dict[str, Any], trial_dir: Path | None, adapter: Any = None
) -> TrainingLoop:
    from pipekit_train.core.testing import regression_task

    if opts["crash"]:
        os._exit(17)  # a worker process dying mid-trial (never use with the serial executor)
    if opts["fail"]:
        raise RuntimeError(f"this trial fails on purpose (params fail={opts['fail']!r})")
    if opts["sleep"]:
        time.sleep(float(opts["sleep"]))
    train, val = regression_task(n_train=int(opts["n_train"]))
    checkpoint = None
    if opts["checkpoint_every"] and trial_dir is not None:
        checkpoint = Checkpoint(
            trial_dir / "checkpoints", every_n_steps=int(opts["checkpoint_every"])
        )
    return TrainingLoop(
        model=model,
        data=train,
        validation=val,
        loss="mse",
        metrics=["mae"],
        optimizer_config={"name": opts["optimizer"], "lr": opts["lr"]},
        batch_size=int(opts["batch_size"]),
        max_steps=int(opts["max_steps"]),
        validate_every_n_steps=int(opts["validate_every"]),
        checkpoint=checkpoint,
        seed=int(opts["seed"]),
        adapter=adapter,
        on_nonfinite=opts["on_nonfinite"],
        progress=False,
    )


def numpy_trial(params: dict[str, Any], *, trial_dir: Path | None = None) -> TrainingLoop:
    """A linear regression trial on the numpy reference backend (fast, no framework).

    Params (all optional): `lr` (1e-2), `batch_size` (32), `max_steps` (40), `seed` (0),
    `model_seed` (0), `optimizer` ("adam" | "sgd"), `validate_every` (10),
    `checkpoint_every` (None: no checkpoints; else every n steps under `trial_dir`),
    `fail` (raise `RuntimeError` before training), `crash` (exit the process — for
    process-executor tests only), `sleep` (seconds, before training),
    `n_train` (256), `on_nonfinite` ("stop"). Metrics: `loss`, `val_loss`, `val_mae`.
    """
    from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp

    opts = _options(params, {"model_seed": 0})
    model = NumpyLinearOp(
        "pipekit_train.core.testing:linear",
        in_size=4,
        out_size=1,
        seed=int(opts["model_seed"]),
    )
    return _loop(model, opts, trial_dir, NumpyAdapter())


_FACTORIES = {
    "equinox": ("pipekit_train.equinox", "EquinoxModelOp", "pipekit_train.equinox.testing:linear"),
    "lightning": (
        "pipekit_train.lightning",
        "TorchModelOp",
        "pipekit_train.lightning.testing:linear",
    ),
    "keras": ("pipekit_train.keras", "KerasModelOp", "pipekit_train.keras.testing:linear"),
}
_ADAPTERS = {"equinox": "Equinox", "keras": "Keras"}


def backend_trial(params: dict[str, Any], *, trial_dir: Path | None = None) -> TrainingLoop:
    """The same toy regression trial on a chosen backend.

    Params: `backend` ("equinox" | "lightning" | "keras" | "numpy", required), `model_seed`
    (0), `factory` (default: the backend package's `testing:linear`), `factory_kwargs`
    (extra JSON kwargs for the factory), `steps_per_execution` (1; Equinox and Keras fuse
    that many optimizer steps into one compiled call), plus every `numpy_trial` param.
    The Keras backend needs `KERAS_BACKEND` set before keras is imported.
    """
    import importlib

    opts = _options(
        params,
        {
            "backend": None,
            "model_seed": 0,
            "factory": None,
            "factory_kwargs": {},
            "steps_per_execution": 1,
        },
    )
    backend = opts["backend"]
    fused = opts["steps_per_execution"]  # the adapter checks it (a positive int)
    if fused != 1 and backend not in _ADAPTERS:
        raise ConfigError(
            f"`steps_per_execution` is for the {sorted(_ADAPTERS)} backends. "
            f"Received: steps_per_execution={fused}, backend={backend!r}."
        )
    if backend == "numpy":
        rest = {k: v for k, v in params.items() if k not in ("backend", "steps_per_execution")}
        return numpy_trial(rest, trial_dir=trial_dir)
    if backend not in _FACTORIES:
        raise ConfigError(
            f"`backend` must be one of {sorted(_FACTORIES) + ['numpy']}. Received: backend={backend!r}."
        )
    module, cls_name, factory = _FACTORIES[backend]
    cls = getattr(importlib.import_module(module), cls_name)
    model = cls(
        opts["factory"] or factory,
        in_size=4,
        out_size=1,
        seed=int(opts["model_seed"]),
        **dict(opts["factory_kwargs"]),
    )
    adapter = None
    if fused != 1:
        adapter = getattr(importlib.import_module(module), _ADAPTERS[backend])(
            steps_per_execution=fused
        )
    return _loop(model, opts, trial_dir, adapter)
