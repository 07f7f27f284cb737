"""Which framework a built model belongs to, and the error for an operator that cannot hold it.

A model operator holds one framework's models (`EquinoxModelOp` an `eqx.Module`,
`LightningModelOp` a `torch.nn.Module`, `KerasModelOp` a `keras.Model`). Handing one of
them another framework's factory should fail at construction with an error that says what
the factory builds, which operator holds that, and the operator's own testing factory of
the same name — not with the framework's `TypeError` from deep inside the build.

The framework is read from the module names of the model's classes, so core never imports
a framework to tell them apart.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from ._errors import ConfigError

__all__ = ["factory_needs_key", "mismatch_error", "model_framework"]

# (top-level module of the model's classes, name in messages, what such a model is).
# Keras comes first: on the torch backend a `keras.Model` is also a `torch.nn.Module`.
_FRAMEWORKS: tuple[tuple[str, str, str], ...] = (
    ("keras", "Keras", "a `keras.Model`"),
    ("equinox", "Equinox", "an `eqx.Module`"),
    ("torch", "PyTorch", "a `torch.nn.Module`"),
)
_LABELS = {root: (label, what) for root, label, what in _FRAMEWORKS}


def model_framework(model: Any) -> str | None:
    """The framework of a built model: `"keras"`, `"equinox"`, `"torch"`, or None if unknown.

    `(module, state)` pairs (`eqx.nn.make_with_state`) are judged by their module.
    """
    if isinstance(model, tuple) and len(model) == 2:
        model = model[0]
    roots = {(getattr(c, "__module__", "") or "").split(".")[0] for c in type(model).__mro__}
    for root, _, _ in _FRAMEWORKS:
        if root in roots:
            return root
    return None


def factory_needs_key(factory: Callable[..., Any], kwargs: Mapping[str, Any]) -> bool:
    """Whether `factory` has a required `key` argument that `kwargs` does not supply.

    That is the signature of a JAX/Equinox factory (`linear(in_size, out_size, *, key)`):
    only an operator that passes the PRNG key itself can call it.
    """
    try:
        param = inspect.signature(factory).parameters.get("key")
    except (TypeError, ValueError):
        return False
    return (
        param is not None
        and param.default is inspect.Parameter.empty
        and param.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        and "key" not in kwargs
    )


def _operators_for(framework: str) -> list[str]:
    """Names of the loaded model operator classes that hold `framework`'s models."""
    from ._operators import ModelOpBase

    found: set[str] = set()
    todo = list(ModelOpBase.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if getattr(cls, "framework", None) == framework and cls.__module__.startswith(
            "pipekit_train."
        ):
            found.add(cls.__name__)
    return sorted(found)


def _matching_factory(op_cls: type, factory: str) -> str | None:
    """The operator package's own testing factory of the same name (or its `mlp`/`linear`)."""
    module = op_cls.__module__
    if not module.startswith("pipekit_train."):
        return None
    testing = ".".join(module.split(".")[:2]) + ".testing"
    try:
        mod = importlib.import_module(testing)
    except Exception:  # the operator's package has no testing module: suggest nothing
        return None
    name = factory.rpartition(":")[2].rpartition(".")[2]
    for candidate in (name, "mlp", "linear"):
        if callable(getattr(mod, candidate, None)):
            return f"{testing}:{candidate}"
    return None


def mismatch_error(
    op_cls: type, factory: str, built: str, *, needs_key: bool = False
) -> ConfigError:
    """The `ConfigError` for an operator class given another framework's factory.

    Args:
        op_cls: the operator class (with a `framework` class attribute).
        factory: the factory's `"module:function"` path.
        built: the framework the factory builds (a `model_framework` value).
        needs_key: the framework was told from a required `key` argument (the factory was
            not called).
    """
    label, what = _LABELS.get(built, (built, f"a {built} model"))
    holds = getattr(op_cls, "framework", None)
    holds_what = _LABELS[holds][1] if holds in _LABELS else "its own framework's models"
    how = ": it takes a PRNG `key`" if needs_key else ""
    owners = _operators_for(built)
    use = (
        " or ".join(f"`{name}`" for name in owners) + " for this factory"
        if owners
        else f"the model operator of the {label} backend for this factory"
    )
    matching = _matching_factory(op_cls, factory)
    if matching is not None:
        use += f", or the matching factory {matching!r} with `{op_cls.__name__}`"
    return ConfigError(
        f"Received: factory={factory!r} with `{op_cls.__name__}`, but the factory builds "
        f"{'an' if label[0] in 'AEIOU' else 'a'} {label} model ({what}{how}) and "
        f"`{op_cls.__name__}` holds {holds_what}. Use {use}."
    )
