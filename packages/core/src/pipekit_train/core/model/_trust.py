"""Trusted model factories: what a stored model config may make this process import and call.

A model config (`{"type": "module:Class", "factory": "module:function", "kwargs": {...}}`)
read back from a registry, a manifest or any other file names code by its import path.
Whoever can edit that file chooses the path, so rebuilding the model must not import and
call whatever it names (`"subprocess:run"` with `kwargs={"args": [...]}` would run a
command). `model_op_from_config` and the registry's `load` therefore resolve the names
through `resolve_trusted`, which decides *before* anything is imported or called:

1. A path into the Python standard library (`os`, `subprocess`, `builtins`, ...) or
   `__main__` is always refused: no model factory lives there.
2. A path on the caller's allow-list is imported and used: `trusted=["mypkg.models"]`
   (a module prefix) trusts the objects *defined* in those modules (not, say,
   `mypkg.models:subprocess.run`, reached through an import), and
   `trusted=["mypkg.models:mlp"]` trusts that exact path. Whatever a path leads to, an
   object defined in the standard library is refused.
3. Otherwise the module is imported only if importing it cannot run code this process
   has not already run: it is already imported (in `sys.modules`), or it is part of
   pipekit-train itself (`pipekit_train.*`). Any other module is refused unimported.
4. The imported object is used only if it is marked: a factory decorated with
   `@model_factory` (the `type` of a config must be a `ModelOpBase` subclass).

So a user's marked factory loads once its module is imported (as Keras's registered
serializables do), or anywhere when its module is on `trusted=`.
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from pipekit_train.core._errors import ConfigError
from pipekit_train.core._imports import import_string, object_path, split_import_path

__all__ = [
    "TrustedList",
    "UntrustedFactoryError",
    "is_model_factory",
    "model_factory",
    "normalize_trusted",
    "resolve_trusted",
]

F = TypeVar("F", bound=Callable[..., Any])

#: What `trusted=` accepts: module prefixes or exact `"module:attr"` paths, the factories
#: themselves, or modules; a single one or a list.
TrustedList = str | Callable[..., Any] | types.ModuleType | Iterable[Any] | None

# id -> the marked object itself (kept alive, so an id is never reused by another object).
_MARKED: dict[int, Any] = {}
_OWN_NAMESPACE = "pipekit_train"
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_HOW = (
    "Mark the function with `@pipekit_train.core.model_factory` (and import its module "
    "before loading), or pass the module or the exact path in `trusted=`, e.g. "
    "trusted=['mypkg.models'] or trusted=['mypkg.models:mlp'], to `load()` / "
    "`model_op_from_config()`."
)


class UntrustedFactoryError(ConfigError):
    """A stored model config names code that is not trusted; it was neither imported nor called.

    Raised by `model_op_from_config` and the registry's `load` for a factory that is not
    marked with `@model_factory` nor on the `trusted=` allow-list (see `pipekit_train.core.model._trust`).
    """


def model_factory(fn: F) -> F:
    """Mark `fn` as a model factory that stored configs may name (returns `fn` unchanged).

    A registry record or stored config whose `factory` is this function (by any import
    path that leads to it) is rebuilt without a `trusted=` argument, once its module is
    imported. Marking says "calling this with any JSON keyword arguments is safe".

    Args:
        fn: a module-level function (or class) that builds a backend model.

    Returns:
        `fn` itself.

    Raises:
        ConfigError: `fn` is not callable.

    Examples:
        ```python
        from pipekit_train.core import model_factory

        @model_factory
        def mlp(in_size: int, out_size: int, *, key): ...
        ```
    """
    if not callable(fn):
        raise ConfigError(
            f"`@model_factory` marks a function or class. Received: {fn!r} "
            f"({type(fn).__name__}). Decorate the factory function itself."
        )
    _MARKED[id(fn)] = fn
    return fn


def is_model_factory(obj: Any) -> bool:
    """Whether `obj` itself was marked with `@model_factory`."""
    return _MARKED.get(id(obj)) is obj


def normalize_trusted(
    trusted: TrustedList,
) -> tuple[frozenset[str], frozenset[str], tuple[Any, ...]]:
    """Split a `trusted=` argument into (module prefixes, exact paths, callables).

    A string with `:` is one exact path (`"mypkg.models:mlp"`); a string without is a
    module prefix (`"mypkg.models"` trusts that module and its submodules). A module
    object trusts its name as a prefix; a callable trusts that very object.

    Raises:
        ConfigError: an entry is not a dotted module name, a `"module:attr"` path, a
            module or a callable.
    """
    if trusted is None:
        return frozenset(), frozenset(), ()
    entries: object = (
        [trusted] if isinstance(trusted, (str, types.ModuleType)) or callable(trusted) else trusted
    )
    if not isinstance(entries, Iterable):
        raise ConfigError(
            f"`trusted` must be a list of module prefixes or 'module:function' paths. "
            f"Received: trusted={trusted!r}. Use e.g. trusted=['mypkg.models']."
        )
    prefixes: set[str] = set()
    exact: set[str] = set()
    objects: list[Any] = []
    for entry in entries:
        if isinstance(entry, types.ModuleType):
            prefixes.add(entry.__name__)
        elif isinstance(entry, str) and ":" in entry:
            module, _, attr = entry.partition(":")
            if not _DOTTED.match(module) or not _DOTTED.match(attr):
                raise ConfigError(
                    f"`trusted` entries must be 'package.module' or 'package.module:function'. "
                    f"Received: trusted entry {entry!r}."
                )
            exact.add(f"{module}:{attr}")
        elif isinstance(entry, str):
            if not _DOTTED.match(entry):
                raise ConfigError(
                    f"`trusted` entries must be 'package.module' or 'package.module:function'. "
                    f"Received: trusted entry {entry!r}."
                )
            prefixes.add(entry)
        elif callable(entry):
            objects.append(entry)
            exact.add(object_path(entry))
        else:
            raise ConfigError(
                "`trusted` entries must be module names, 'module:function' paths, modules or "
                f"factories. Received: trusted entry {entry!r} ({type(entry).__name__})."
            )
    return frozenset(prefixes), frozenset(exact), tuple(objects)


def _under(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _is_stdlib(module: str) -> bool:
    top = module.split(".", 1)[0]
    return module == "__main__" or top in sys.stdlib_module_names or top in sys.builtin_module_names


def _stdlib_error(field: str, path: Any, what: str) -> UntrustedFactoryError:
    return UntrustedFactoryError(
        f"The stored model config names {field}={path!r}, which is in the Python standard "
        f"library (or `__main__`); {what}. Received: {field}={path!r}. No model factory "
        "lives there, so it is refused even when listed in `trusted=`: the config was "
        "edited or is not a model config."
    )


def resolve_trusted(
    path: Any,
    *,
    trusted: TrustedList = None,
    field: str = "factory",
    accept: Callable[[Any], bool] | None = None,
    what: str = "a model factory marked with `@model_factory`",
) -> Any:
    """Import `path` from a stored config only if it is trusted (see the module docstring).

    Args:
        path: the `"module:attribute"` path read from the config.
        trusted: the caller's allow-list (module prefixes, exact paths, modules, callables).
        field: the config field, for the error message (`"factory"`, `"type"`).
        accept: decides whether an imported, unlisted object is trusted; default: it is
            marked with `@model_factory`.
        what: what an acceptable object is, for the error message.

    Returns:
        The imported object.

    Raises:
        UntrustedFactoryError: the path is not trusted; nothing was imported or called
            (except a module that was already imported or is part of pipekit-train, whose
            object is then found unmarked).
        ConfigError: the path is malformed or cannot be imported.
    """
    module, attr = split_import_path(path, field=field)
    if not _DOTTED.match(module) or not _DOTTED.match(attr):
        raise UntrustedFactoryError(
            f"`{field}` must be a 'package.module:function' path. Received: {field}={path!r}. "
            "The stored config is malformed or was edited; it was not imported."
        )
    if _is_stdlib(module):
        raise _stdlib_error(field, path, "it was not imported or called")
    prefixes, exact, objects = normalize_trusted(trusted)
    listed = _under(module, prefixes) or f"{module}:{attr}" in exact
    importable = (
        listed
        or module in sys.modules
        or module == _OWN_NAMESPACE
        or module.startswith(_OWN_NAMESPACE + ".")
    )
    if not importable:
        raise UntrustedFactoryError(
            f"The stored model config names {field}={path!r} in a module that is not trusted "
            f"and not imported yet; importing it could run code, so it was neither imported "
            f"nor called. Received: {field}={path!r}. {_HOW}"
        )
    obj = import_string(path, field=field)
    defined_in = getattr(obj, "__module__", None)
    if isinstance(defined_in, str) and _is_stdlib(defined_in):
        # e.g. "mypkg.models:subprocess.run", reached through a module's attributes.
        raise _stdlib_error(field, path, f"it is defined in {defined_in!r} and was not called")
    if (
        f"{module}:{attr}" in exact
        or any(obj is o for o in objects)
        or (isinstance(defined_in, str) and _under(defined_in, prefixes))
    ):
        return obj
    ok = accept(obj) if accept is not None else is_model_factory(obj)
    if not ok:
        raise UntrustedFactoryError(
            f"The stored model config names {field}={path!r}, which is not {what}; it was not "
            f"called. Received: {field}={path!r}. {_HOW}"
        )
    return obj
