"""The pipekit operator contracts: `Operator`, `StatefulOperator`, `ModelOp`.

A model operator wraps a backend model (an `eqx.Module`, a `torch.nn.Module`, a
`keras.Model`) built by an importable factory from JSON keyword arguments, so it can
be rebuilt anywhere from its config alone. Weights travel separately as bytes in the
backend's own safe format; nothing is ever unpickled.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from pipekit_train.core._checks import check_seed
from pipekit_train.core._errors import ConfigError
from pipekit_train.core._imports import import_string, object_path

from ._kind import Framework, factory_needs_key, mismatch_error, model_framework
from ._trust import TrustedList, resolve_trusted

if TYPE_CHECKING:
    from pipekit_train.core.contract._adapter import Adapter

__all__ = [
    "ModelOp",
    "ModelOpBase",
    "Operator",
    "StatefulOperator",
    "check_seed",
    "model_op_from_config",
]


class Operator(Protocol):
    """Something that maps inputs to outputs on numpy arrays and has a JSON config."""

    def __call__(self, inputs: Any) -> Any:
        """Apply the operator."""
        ...

    def get_config(self) -> dict[str, Any]:
        """Return a JSON-serialisable config from which `from_config` rebuilds the operator."""
        ...


class StatefulOperator(Protocol):
    """An operator whose state advances when it runs (`TrainingLoop`, `Cycle`, sweeps)."""

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """Advance the state and return the result."""
        ...


class ModelOp(Operator, Protocol):
    """A trained-model operator: config, deterministic weight bytes, rebuild with weights."""

    backend: str

    def serialize_weights(self) -> bytes:
        """Return the weights as bytes (same weights give the same bytes)."""
        ...

    def with_weights(self, blob: bytes) -> ModelOp:
        """Return a new operator with the same config and the weights in `blob`."""
        ...


def _check_json(kwargs: Mapping[str, Any], *, owner: str) -> dict[str, Any]:
    try:
        text = json.dumps(dict(kwargs), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"`{owner}` keyword arguments must be JSON-serialisable (numbers, strings, lists, "
            f"dicts) so the model can be rebuilt from its config. Received: kwargs={dict(kwargs)!r} "
            f"({exc})."
        ) from exc
    return json.loads(text)


class ModelOpBase:
    """Shared machinery of the backend model operators.

    Subclasses set `backend`, implement `_build(factory, kwargs, seed)` (returning the
    backend model), `__call__`, `serialize_weights`, `_load_weights(blob)` and
    `default_adapter()`.

    A subclass that sets `framework` (the top-level module of the models it holds:
    `"equinox"`, `"torch"`, `"keras"`), `framework_label` (its name in messages) and
    `framework_model` (what such a model is) gets a clear `ConfigError` when it is handed
    another framework's factory: a factory with a required `key` argument is refused
    before it is called (unless the subclass sets `factory_takes_key`, as the Equinox
    operator does), and `_build` calls `check_model(model)` on what the factory returned.
    The frameworks core can tell apart are those of the operator classes loaded.

    `default_adapter()` builds the adapter the `pipekit_train.backends` entry point named
    `backend` registers.

    Args:
        factory: an importable callable or its `"module:function"` string.
        seed: the seed the model is built under.
        **kwargs: JSON keyword arguments forwarded to the factory.
    """

    backend: ClassVar[str] = "abstract"
    framework: ClassVar[str | None] = None
    framework_label: ClassVar[str] = ""
    framework_model: ClassVar[str] = ""
    factory_takes_key: ClassVar[bool] = False

    def __init__(self, factory: str | Callable[..., Any], *, seed: int = 0, **kwargs: Any):
        seed = check_seed(seed)
        if callable(factory) and not isinstance(factory, str):
            factory_path = object_path(factory)
            factory_fn = factory
        else:
            factory_path = factory
            factory_fn = import_string(factory_path, field="factory")
            if not callable(factory_fn):
                raise ConfigError(
                    f"`factory` must name a callable. Received: factory={factory_path!r}, "
                    f"which is a {type(factory_fn).__name__}."
                )
        self.factory: str = factory_path
        self.seed: int = int(seed)
        self.kwargs: dict[str, Any] = _check_json(kwargs, owner=type(self).__name__)
        self._factory_fn = factory_fn
        if (
            self.framework is not None
            and not self.factory_takes_key
            and factory_needs_key(factory_fn, self.kwargs)
        ):
            raise self._mismatch(factory_path, _key_taking(), needs_key=True)
        self.model: Any = self._build(factory_fn, self.kwargs, self.seed)

    def check_model(self, model: Any) -> None:
        """Refuse a model of another framework than the one this operator holds.

        Raises:
            ConfigError: `model` (what the factory returned) belongs to another framework;
                the error names it, this operator class and the matching factory.
        """
        if self.framework is None:
            return
        built = model_framework(model, {self.framework, *_frameworks()})
        if built is not None and built != self.framework:
            raise self._mismatch(self.factory, _frameworks()[built])

    def _mismatch(self, factory: str, built: Framework, *, needs_key: bool = False) -> ConfigError:
        owners = sorted(cls.__name__ for cls in _operator_classes() if cls.framework == built.root)
        return mismatch_error(
            type(self),
            factory,
            built,
            holds=_framework_of(type(self)),
            owners=owners,
            needs_key=needs_key,
        )

    # -- to be provided by each backend ------------------------------------------------
    def _build(self, factory: Callable[..., Any], kwargs: dict[str, Any], seed: int) -> Any:
        raise NotImplementedError

    def _load_weights(self, blob: bytes) -> None:
        raise NotImplementedError

    def serialize_weights(self) -> bytes:
        """Return the weights as deterministic bytes in the backend's safe format."""
        raise NotImplementedError

    def __call__(self, inputs: Any) -> np.ndarray:
        """Run batched inference on a numpy array and return a numpy array."""
        raise NotImplementedError

    def default_adapter(self) -> Adapter:
        """The adapter `TrainingLoop` uses for this operator when none is given: the one
        registered under the backend name `backend` (its default options)."""
        from pipekit_train.core.contract._backends import load_backend

        return load_backend(self.backend).adapter_class()()

    # -- shared ------------------------------------------------------------------------
    def get_config(self) -> dict[str, Any]:
        """Return `{"type", "factory", "kwargs", "seed", "backend"}` (JSON)."""
        return {
            "type": object_path(type(self)),
            "backend": self.backend,
            "factory": self.factory,
            "kwargs": dict(self.kwargs),
            "seed": self.seed,
        }

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelOpBase:
        """Rebuild an operator (with freshly initialised weights) from `get_config()`."""
        return cls(config["factory"], seed=config.get("seed", 0), **config.get("kwargs", {}))

    def with_weights(self, blob: bytes) -> ModelOpBase:
        """Return a new operator with this config and the weights in `blob`."""
        new = type(self).from_config(self.get_config())
        new._load_weights(blob)
        return new

    def with_model(self, model: Any) -> ModelOpBase:
        """Return a shallow copy of this operator holding `model` (used by adapters)."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.model = model
        return new

    def with_seed(self, seed: int) -> ModelOpBase:
        """A copy of this operator built under `seed` (freshly initialised weights; the
        model of a `SeedGroup` member)."""
        seed = check_seed(seed)
        new = self.with_model(None)  # a subclass's copy drops its caches
        new.seed = seed
        new.model = new._build(new._factory_fn, new.kwargs, seed)
        return new

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.factory!r}, seed={self.seed}, **{self.kwargs!r})"


def model_op_from_config(config: Mapping[str, Any], *, trusted: TrustedList = None) -> Any:
    """Rebuild a model operator (freshly initialised) from a stored config.

    The config may come from a file that someone else can edit, so the code it names is
    checked before anything is imported or called (see `pipekit_train.core.model._trust`):
    `config["type"]` must be a `ModelOpBase` subclass (or on `trusted`), and
    `config["factory"]` a factory marked with `@model_factory` (or on `trusted`). Paths
    into the standard library (`subprocess:run`, `os:system`, `builtins:eval`, ...) are
    always refused. Nothing is unpickled.

    To build an operator from your own code, construct it directly
    (`EquinoxModelOp("mypkg.models:mlp", ...)`); no trust check applies there.

    Args:
        config: `model_op.get_config()` output (`type`, `factory`, `kwargs`, `seed`, ...).
        trusted: module prefixes (`"mypkg.models"`), exact `"module:function"` paths,
            modules or factories whose code you trust, beyond the marked factories.

    Raises:
        UntrustedFactoryError: `type` or `factory` is not trusted; nothing was called.
        ConfigError: the config is malformed.
    """
    if not isinstance(config, Mapping) or "type" not in config:
        raise ConfigError(
            "A model config needs a `type` ('module:Class'). "
            f"Received: config keys={sorted(config) if isinstance(config, Mapping) else config!r}."
        )
    cls = resolve_trusted(
        config["type"],
        trusted=trusted,
        field="type",
        accept=lambda c: isinstance(c, type) and issubclass(c, ModelOpBase),
        what="a model operator class (a `ModelOpBase` subclass)",
    )
    if not hasattr(cls, "from_config"):
        raise ConfigError(
            f"`type` must name a model operator class with `from_config`. "
            f"Received: type={config['type']!r}."
        )
    if "factory" in config:
        resolve_trusted(config["factory"], trusted=trusted, field="factory")
    return cls.from_config(config)


def _operator_classes() -> list[type[ModelOpBase]]:
    """Every loaded `ModelOpBase` subclass of a pipekit package."""
    found: list[type[ModelOpBase]] = []
    todo = list(ModelOpBase.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__.startswith("pipekit_train."):
            found.append(cls)
    return found


def _framework_of(cls: type[ModelOpBase]) -> Framework | None:
    if cls.framework is None:
        return None
    label = cls.framework_label or cls.framework
    return Framework(cls.framework, label, cls.framework_model or f"a {label} model")


def _frameworks() -> dict[str, Framework]:
    """The frameworks the loaded operator classes hold, by root module."""
    out: dict[str, Framework] = {}
    for cls in _operator_classes():
        fw = _framework_of(cls)
        if fw is not None:
            out.setdefault(fw.root, fw)
    return out


def _key_taking() -> Framework:
    """The framework whose factories take a PRNG `key` (the one of an operator class that
    passes it), or a generic description when no such operator is loaded."""
    for cls in _operator_classes():
        fw = _framework_of(cls)
        if cls.factory_takes_key and fw is not None:
            return fw
    return Framework("", "JAX", "a model whose factory takes a PRNG `key`")
