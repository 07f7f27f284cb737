"""Which framework a built model belongs to, and the error for an operator that cannot hold it.

A model operator holds one framework's models (`EquinoxModelOp` an `eqx.Module`,
`LightningModelOp` a `torch.nn.Module`, `KerasModelOp` a `keras.Model`). Handing one of
them another framework's factory should fail at construction with an error that says what
the factory builds, which operator holds that, and the operator's own testing factory of
the same name — not with the framework's `TypeError` from deep inside the build.

The framework is read from the module names of the model's classes, and the frameworks
are those the loaded operator classes declare (`ModelOpBase.framework`,
`framework_label`, `framework_model`): core names none and never imports one.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipekit_train.core._errors import ConfigError

__all__ = ["Framework", "factory_needs_key", "mismatch_error", "model_framework"]


@dataclass(frozen=True)
class Framework:
    """What a model operator class says of the framework whose models it holds.

    Attributes:
        root: the framework's top-level module (`"torch"`, `"equinox"`, `"keras"`).
        label: its name in messages (`"PyTorch"`).
        model: what such a model is (`"a `torch.nn.Module`"`).
    """

    root: str
    label: str
    model: str


def model_framework(model: Any, known: Iterable[str]) -> str | None:
    """The framework of a built model: the root module of the first class in its MRO
    that belongs to one of the `known` frameworks, or None.

    The MRO order matters: on Keras's torch backend a `keras.Model` is also a
    `torch.nn.Module`, and Keras's classes come first. `(module, state)` pairs
    (`eqx.nn.make_with_state`) are judged by their module.
    """
    if isinstance(model, tuple) and len(model) == 2:
        model = model[0]
    roots = set(known)
    for cls in type(model).__mro__:
        root = (getattr(cls, "__module__", "") or "").split(".")[0]
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
    op_cls: type,
    factory: str,
    built: Framework,
    *,
    holds: Framework | None,
    owners: Sequence[str],
    needs_key: bool = False,
) -> ConfigError:
    """The `ConfigError` for an operator class given another framework's factory.

    Args:
        op_cls: the operator class.
        factory: the factory's `"module:function"` path.
        built: the framework the factory builds.
        holds: the framework `op_cls` holds.
        owners: names of the loaded operator classes that hold `built`'s models.
        needs_key: the framework was told from a required `key` argument (the factory was
            not called).
    """
    holds_what = holds.model if holds is not None else "its own framework's models"
    how = ": it takes a PRNG `key`" if needs_key else ""
    use = (
        " or ".join(f"`{name}`" for name in owners) + " for this factory"
        if owners
        else f"the model operator of the {built.label} backend for this factory"
    )
    matching = _matching_factory(op_cls, factory)
    if matching is not None:
        use += f", or the matching factory {matching!r} with `{op_cls.__name__}`"
    label = built.label
    return ConfigError(
        f"Received: factory={factory!r} with `{op_cls.__name__}`, but the factory builds "
        f"{'an' if label[0] in 'AEIOU' else 'a'} {label} model ({built.model}{how}) and "
        f"`{op_cls.__name__}` holds {holds_what}. Use {use}."
    )
