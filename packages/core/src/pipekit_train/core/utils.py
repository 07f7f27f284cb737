"""Helpers for packages built on core (the sweep package, third-party backends).

- `import_string("module:attr")`, `object_path(obj)`: find an object by its import path
  and back;
- `optional_import(module, extra=..., package=...)`: import an optional dependency, or
  raise an `ImportError` naming the extra to install.

Adapter authors find the training contract in `pipekit_train.core.adapter`.
"""

from ._imports import import_string, object_path, optional_import

__all__ = ["import_string", "object_path", "optional_import"]
