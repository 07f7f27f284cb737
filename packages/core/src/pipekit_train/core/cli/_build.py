"""Turn a validated `RunConfig` into a `TrainingLoop`: imports first, then the work.

Order: the backend's adapter package is imported by name (a missing one is a
`ConfigError` naming the package to install); every name the config gives is imported
and every keyword argument is bound to its signature; only then are the datasets built,
the normaliser fitted and the model built, and `TrainingLoop` validates the run and
probes the model. Writers, which may create files, are built last, once everything else
has passed, so a bad config leaves nothing on disk.

Trust: a run config is code the user runs, like a driver script (`python train.py`),
so the factories it names are imported and called without the `@model_factory` /
`trusted=` check that guards configs *read back* from a registry or a checkpoint.
Never run a config you would not run as a script.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipekit_train.core._errors import ConfigError
from pipekit_train.core._imports import import_string
from pipekit_train.core.contract._backends import load_backend

from ._config import CALLBACKS, WRITERS, ComponentSpec, FactorySpec, RunConfig
from ._wording import in_cli_terms

__all__ = ["Built", "build_loop", "python_path"]


def _backend_classes(backend: str) -> tuple[Any, Any]:
    """`(model-operator class, adapter class)` of a registered backend."""
    entry = load_backend(backend)
    try:
        return entry.model_op_class(), entry.adapter_class()
    except ImportError as exc:
        fix = f" Install it with `{entry.install}`." if entry.install else ""
        raise ConfigError(
            f"--backend {backend} needs {entry.adapter.partition(':')[0]}, which cannot be "
            f"imported ({exc}). Received: backend={backend!r}.{fix}"
        ) from exc


@contextlib.contextmanager
def python_path(folders: tuple[Path, ...]) -> Iterator[None]:
    """Put `folders` first on `sys.path` for the duration (restored afterwards)."""
    saved = list(sys.path)
    sys.path[:0] = [str(f) for f in folders]
    try:
        yield
    finally:
        sys.path[:] = saved


def _bind(
    where: str,
    fn: Any,
    kwargs: Mapping[str, Any],
    *,
    partial: bool = False,
    supplied: tuple[str, ...] = (),
    supplier: str = "",
) -> None:
    """Check that `fn` accepts `kwargs` (names only; values are the callee's to check).

    `supplied` names arguments the caller passes itself (`supplier`): they are neither
    accepted from the config nor offered in the message.
    """
    for name in supplied:
        if name in kwargs:
            raise ConfigError(
                f"`{where}.{name}` is passed to the factory by {supplier}; the config cannot "
                f"set it. Received: {where}.{name}={kwargs[name]!r}. Drop it from {where}."
            )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin without a signature: the call itself will tell
    try:
        if partial:
            signature.bind_partial(**kwargs)
        else:
            signature.bind(**kwargs)
    except TypeError as exc:
        accepted = [
            name
            for name, p in signature.parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name not in supplied
        ]
        raise ConfigError(
            f"`{where}` does not fit {getattr(fn, '__qualname__', fn)!r}: {exc}. "
            f"Received: {where}={dict(kwargs)!r}. Accepted arguments: {accepted}."
        ) from exc


def _resolve(where: str, path: str, pythonpath: tuple[Path, ...] = ()) -> Any:
    try:
        obj = import_string(path, field=where)
    except ConfigError as exc:
        missing = exc.__cause__
        module = path.partition(":")[0]
        if not (
            isinstance(missing, ModuleNotFoundError)
            and missing.name is not None
            and (module == missing.name or module.startswith(missing.name + "."))
        ):
            raise  # the module is there but fails to import: its own message says why
        folders = [str(p) for p in pythonpath]
        raise ConfigError(
            f"`{where}` names a module that cannot be imported: {missing}. Received: "
            f"{where}={path!r}, pythonpath={folders}. Add the folder that holds the module to "
            "the config's `pythonpath` key (folders relative to the config file, e.g. "
            'pythonpath = ["."] when it sits beside the config), or install its package.'
        ) from missing
    if not callable(obj):
        raise ConfigError(
            f"`{where}` must name a function or class. Received: {where}={path!r}, which is "
            f"a {type(obj).__name__}."
        )
    return obj


def _component_class(
    spec: ComponentSpec, builtins: Mapping[str, str], module: str, pythonpath: tuple[Path, ...]
) -> Any:
    if spec.type in builtins:
        return getattr(importlib.import_module(module), builtins[spec.type])
    return _resolve(f"{spec.where}.type", spec.type, pythonpath)


def _call_dataset(spec: FactorySpec, fn: Callable[..., Any]) -> Any:
    try:
        return fn(**spec.kwargs)
    except ConfigError as exc:
        raise ConfigError(f"[{spec.where}] {exc}") from exc


@dataclass
class Built:
    """Everything `build_loop` made: the loop, plus what the run command reports."""

    loop: Any
    writers: tuple[Any, ...]
    model_factory: str
    data_sizes: dict[str, int | None]


def build_loop(
    config: RunConfig,
    *,
    extra_callbacks: tuple[Any, ...] = (),
    progress_bar: bool = False,
    build_writers: bool = True,
) -> Built:
    """Build the `TrainingLoop` a config describes (writers last; see the module docstring).

    Args:
        config: a validated run config.
        extra_callbacks: callbacks to add after the config's (the CLI's progress lines).
        progress_bar: show core's `ProgressBar`.
        build_writers: build the writers (a dry run checks their arguments only).

    Raises:
        ConfigError: a name that does not import, arguments a factory or class does not
            take, a missing backend package, or anything `TrainingLoop` refuses.
    """
    # -- every name imported, every argument bound: still no work ----------------------
    pythonpath = config.pythonpath
    data_fn = _resolve("data.factory", config.data.factory, pythonpath)
    _bind("data.kwargs", data_fn, config.data.kwargs)
    val_fn = None
    if config.validation is not None:
        val_fn = _resolve("validation.factory", config.validation.factory, pythonpath)
        _bind("validation.kwargs", val_fn, config.validation.kwargs)
    op_class, adapter_class = _backend_classes(config.backend)
    model_factory = config.model.factory_for(config.backend)
    model_fn = _resolve("model.factory", model_factory, pythonpath)
    _bind(
        "model.kwargs",
        model_fn,
        config.model.kwargs,
        partial=True,
        supplied=load_backend(config.backend).supplied_kwargs,
        supplier=f"the {config.backend} model operator ({op_class.__name__})",
    )
    _bind(f"adapter.{config.backend}", adapter_class, config.adapter)
    loop_kwargs = dict(config.loop)
    loss = loop_kwargs.get("loss")
    if isinstance(loss, str) and ":" in loss:
        loop_kwargs["loss"] = _resolve("loss", loss, pythonpath)
    metrics = loop_kwargs.get("metrics")
    if isinstance(metrics, list):
        loop_kwargs["metrics"] = [
            _resolve("metrics", m, pythonpath) if isinstance(m, str) and ":" in m else m
            for m in metrics
        ]
    elif isinstance(metrics, Mapping):
        loop_kwargs["metrics"] = {
            k: _resolve(f"metrics.{k}", m, pythonpath) if isinstance(m, str) and ":" in m else m
            for k, m in metrics.items()
        }
    callback_classes = [
        _component_class(s, CALLBACKS, "pipekit_train.core.callbacks", pythonpath)
        for s in config.callbacks
    ]
    writer_classes = [
        _component_class(s, WRITERS, "pipekit_train.core.writers", pythonpath)
        for s in config.writers
    ]
    for spec, cls in zip(
        (*config.callbacks, *config.writers), (*callback_classes, *writer_classes), strict=True
    ):
        _bind(spec.where, cls, spec.kwargs)
    adapter = adapter_class(**config.adapter)
    callbacks = [cls(**s.kwargs) for s, cls in zip(config.callbacks, callback_classes, strict=True)]

    # -- the work: data, normaliser, model, then the loop's own validation -------------
    data = _call_dataset(config.data, data_fn)
    validation = None
    if isinstance(data, (tuple, list)) and len(data) != 2:
        raise ConfigError(
            f"`data.factory` {config.data.factory!r} returned a {type(data).__name__} of "
            f"{len(data)}. Received: {len(data)} parts. Return one dataset (with data.split "
            "or [validation] for the validation data) or a (train, validation) pair."
        )
    if isinstance(data, (tuple, list)):
        data, validation = data
        if config.split is not None or val_fn is not None:
            raise ConfigError(
                f"`data.factory` {config.data.factory!r} returned (train, validation), and the "
                "config also defines validation data (data.split or [validation]). "
                "Received: both. Keep one."
            )
    from pipekit_train.core.data import Trajectories, TrajectoryWindows

    if config.split is not None:
        from pipekit_train.core.data import split

        if isinstance(data, (Trajectories, TrajectoryWindows)):  # by trajectory: no leakage
            data, validation = data.split(config.split, config.split_seed)
        else:
            data, validation = split(data, config.split, seed=config.split_seed)
    if val_fn is not None and config.validation is not None:
        validation = _call_dataset(config.validation, val_fn)
    normalizer = None
    if config.normalizer is not None:
        from pipekit_train.core.data import Normalizer

        if "per" in config.normalizer:
            if not isinstance(data, TrajectoryWindows):
                raise ConfigError(
                    "`normalizer.per` fits the trajectory normalizer of TrajectoryWindows "
                    f"data, but the training data (from `data.factory` {config.data.factory!r}) "
                    f"is a {type(data).__name__}. Received: normalizer.per="
                    f'{config.normalizer["per"]!r}. Use normalizer.keys = ["x", "y"].'
                )
            normalizer = data.normalizer(per=config.normalizer["per"])
        elif "keys" in config.normalizer:
            if isinstance(data, TrajectoryWindows) and "rollout" in config.loop:
                raise ConfigError(
                    "Rollout training normalises states and targets per channel, over the "
                    "trajectories; `normalizer.keys` fits every window position apart. "
                    f"Received: normalizer.keys={config.normalizer['keys']!r} with a [rollout] "
                    'table. Use normalizer.per = "channel" instead.'
                )
            normalizer = Normalizer.fit(data, keys=config.normalizer["keys"])
        else:
            path = Path(config.normalizer["path"])
            try:
                normalizer = Normalizer.from_json(path.read_text())
            except OSError as exc:
                raise ConfigError(
                    f"`normalizer.path` cannot be read: {exc}. "
                    f"Received: normalizer.path={str(path)!r}."
                ) from exc
    model = op_class(model_factory, seed=config.model.seed, **config.model.kwargs)

    from pipekit_train.core import TrainingLoop

    try:
        loop = TrainingLoop(
            model,
            data,
            validation,
            callbacks=[*callbacks, *extra_callbacks],
            checkpoint=config.checkpoint,
            adapter=adapter,
            normalizer=normalizer,
            progress=progress_bar,
            **loop_kwargs,
        )
    except ConfigError as exc:
        worded = in_cli_terms(exc, config)
        if worded is exc:
            raise
        raise worded from exc

    # -- writers last: some create files when built ------------------------------------
    from pipekit_train.core.writers import AsyncWriter, check_writer

    writers = []
    for spec, cls in zip(config.writers if build_writers else (), writer_classes, strict=False):
        kwargs = dict(spec.kwargs)
        if spec.type == "wandb" and "config" not in kwargs:
            kwargs["config"] = config.raw  # the run's hyperparameters, as W&B's run config
        writer = check_writer(cls(**kwargs), field=spec.where)
        writers.append(AsyncWriter(writer) if spec.wrap_async else writer)
    if writers:
        loop.plan = dataclasses.replace(loop.plan, writers=tuple(writers))
    sizes = {
        "data": len(data) if hasattr(data, "__len__") else None,
        "validation": len(validation)
        if validation is not None and hasattr(validation, "__len__")
        else None,
    }
    return Built(loop=loop, writers=tuple(writers), model_factory=model_factory, data_sizes=sizes)
