"""Small import helpers: import-by-name and optional dependencies with a clear error."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ._errors import ConfigError

__all__ = ["import_string", "moved_names", "object_path", "optional_import", "split_import_path"]


def split_import_path(path: Any, *, field: str = "factory") -> tuple[str, str]:
    """Split `"package.module:attribute"` (or `"package.module.attribute"`) into its parts.

    Args:
        path: the import path; `:` separates the module from the attribute path.
        field: the name of the user-facing field, used in the error message.

    Returns:
        `(module, attribute_path)`.

    Raises:
        ConfigError: `path` is not a non-empty string with a module and an attribute.
    """
    if not isinstance(path, str) or not path:
        raise ConfigError(
            f"`{field}` must be an import string like 'package.module:function'. "
            f"Received: {field}={path!r}."
        )
    if ":" in path:
        module_name, _, attr_path = path.partition(":")
    else:
        module_name, _, attr_path = path.rpartition(".")
    if not module_name or not attr_path:
        raise ConfigError(
            f"`{field}` must be an import string like 'package.module:function'. "
            f"Received: {field}={path!r}."
        )
    return module_name, attr_path


def import_string(path: str, *, field: str = "factory") -> Any:
    """Import `"package.module:attribute"` (or `"package.module.attribute"`) and return it.

    Args:
        path: the import path; `:` separates the module from the attribute path.
        field: the name of the user-facing field, used in the error message.

    Raises:
        ConfigError: the module or attribute cannot be imported.
    """
    module_name, attr_path = split_import_path(path, field=field)
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"`{field}` names a module that cannot be imported: {exc}. "
            f"Received: {field}={path!r}. Make the module importable (installed or on sys.path)."
        ) from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise ConfigError(
                f"`{field}` names an attribute that does not exist: module {module_name!r} has "
                f"no {attr_path!r}. Received: {field}={path!r}."
            ) from exc
    return obj


def object_path(obj: Callable[..., Any] | type) -> str:
    """Return the `"module:qualname"` import string of a module-level function or class.

    Raises:
        ConfigError: the object is a lambda, a closure or otherwise not importable by name.
    """
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not module or not qualname or "<" in qualname or module == "__main__":
        raise ConfigError(
            "A factory must be importable by name so a model can be rebuilt from JSON. "
            f"Received: factory={obj!r}. Define it at module level in an importable module "
            "and pass it (or its 'module:function' string)."
        )
    return f"{module}:{qualname}"


def optional_import(module: str, *, extra: str, package: str) -> ModuleType:
    """Import an optional dependency or raise an `ImportError` naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"`{module}` is required for this feature but is not installed. "
            f"Install it with `pip install '{package}[{extra}]'`."
        ) from exc


def moved_names(module: str, moves: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` that still serves names which moved elsewhere, with a warning.

    A public module that stops exporting a name keeps old imports working this way,
    without holding the name in its `__all__`.

    Args:
        module: the dotted name of the module the names left.
        moves: name → the module to import it from now.

    Returns:
        The `__getattr__` to assign in `module`.
    """

    def __getattr__(name: str) -> Any:
        if name not in moves:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        import warnings

        warnings.warn(
            f"`{module}.{name}` moved: import it from `{moves[name]}`.",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(moves[name]), name)

    return __getattr__
