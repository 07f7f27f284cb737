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

from ._config import CALLBACKS, WRITERS, ComponentSpec, FactorySpec, RunConfig

__all__ = ["BackendInfo", "Built", "backend_info", "build_loop", "python_path"]


@dataclass(frozen=True)
class BackendInfo:
    """Where a backend's adapter lives and how to install it."""

    module: str
    model_op: str
    adapter: str
    install: str


_BACKENDS = {
    "equinox": BackendInfo(
        "pipekit_train.equinox", "EquinoxModelOp", "Equinox", "pip install pipekit-train-equinox"
    ),
    "lightning": BackendInfo(
        "pipekit_train.lightning",
        "LightningModelOp",
        "Lightning",
        "pip install pipekit-train-lightning",
    ),
    "keras": BackendInfo(
        "pipekit_train.keras", "KerasModelOp", "Keras", "pip install 'pipekit-train-keras[jax]'"
    ),
}


def backend_info(backend: str) -> BackendInfo:
    """The `BackendInfo` of a backend name."""
    return _BACKENDS[backend]


def _import_backend(backend: str) -> Any:
    info = _BACKENDS[backend]
    try:
        return importlib.import_module(info.module)
    except ImportError as exc:
        raise ConfigError(
            f"--backend {backend} needs the {info.module} package, which cannot be imported "
            f"({exc}). Received: backend={backend!r}. Install it with `{info.install}`."
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


def _bind(where: str, fn: Any, kwargs: Mapping[str, Any], *, partial: bool = False) -> None:
    """Check that `fn` accepts `kwargs` (names only; values are the callee's to check)."""
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
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
        raise ConfigError(
            f"`{where}` does not fit {getattr(fn, '__qualname__', fn)!r}: {exc}. "
            f"Received: {where}={dict(kwargs)!r}. Accepted arguments: {accepted}."
        ) from exc


def _resolve(where: str, path: str) -> Any:
    obj = import_string(path, field=where)
    if not callable(obj):
        raise ConfigError(
            f"`{where}` must name a function or class. Received: {where}={path!r}, which is "
            f"a {type(obj).__name__}."
        )
    return obj


def _component_class(spec: ComponentSpec, builtins: Mapping[str, str], module: str) -> Any:
    if spec.type in builtins:
        return getattr(importlib.import_module(module), builtins[spec.type])
    return _resolve(f"{spec.where}.type", spec.type)


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
    data_fn = _resolve("data.factory", config.data.factory)
    _bind("data.kwargs", data_fn, config.data.kwargs)
    val_fn = None
    if config.validation is not None:
        val_fn = _resolve("validation.factory", config.validation.factory)
        _bind("validation.kwargs", val_fn, config.validation.kwargs)
    backend = _import_backend(config.backend)
    info = _BACKENDS[config.backend]
    op_class = getattr(backend, info.model_op)
    adapter_class = getattr(backend, info.adapter)
    model_factory = config.model.factory_for(config.backend)
    model_fn = _resolve("model.factory", model_factory)
    _bind("model.kwargs", model_fn, config.model.kwargs, partial=True)
    _bind(f"adapter.{config.backend}", adapter_class, config.adapter)
    loop_kwargs = dict(config.loop)
    loss = loop_kwargs.get("loss")
    if isinstance(loss, str) and ":" in loss:
        loop_kwargs["loss"] = _resolve("loss", loss)
    metrics = loop_kwargs.get("metrics")
    if isinstance(metrics, list):
        loop_kwargs["metrics"] = [
            _resolve("metrics", m) if isinstance(m, str) and ":" in m else m for m in metrics
        ]
    elif isinstance(metrics, Mapping):
        loop_kwargs["metrics"] = {
            k: _resolve(f"metrics.{k}", m) if isinstance(m, str) and ":" in m else m
            for k, m in metrics.items()
        }
    callback_classes = [
        _component_class(s, CALLBACKS, "pipekit_train.core.callbacks") for s in config.callbacks
    ]
    writer_classes = [
        _component_class(s, WRITERS, "pipekit_train.core.writers") for s in config.writers
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
    if config.split is not None:
        from pipekit_train.core.data import split

        data, validation = split(data, config.split, seed=config.split_seed)
    if val_fn is not None and config.validation is not None:
        validation = _call_dataset(config.validation, val_fn)
    normalizer = None
    if config.normalizer is not None:
        from pipekit_train.core.data import Normalizer

        if "keys" in config.normalizer:
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
