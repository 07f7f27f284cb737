"""Helpers for packages built on core (the sweep package, third-party backends).

- `import_string("module:attr")`, `object_path(obj)`: find an object by its import path
  and back;
- `optional_import(module, extra=..., package=...)`: import an optional dependency, or
  raise an `ImportError` naming the extra to install;
- `backend_names()`, `load_backend(name)`, `BACKENDS_GROUP`: the installed backends (the
  `pipekit_train.backends` entry points), listed without importing them, and loaded.
- `write_atomic`, `create_exclusive`, `ExclusiveLock`: the one atomic write, exclusive
  create and file lock every package writes local files through.

Adapter authors find everything they take from core (the Ray Train drivers included) in
`pipekit_train.core.adapter`; `fit_with_ray_trainer`, `ray_train_worker`, `check_ray_fit`
and `RayTrainReport` still import from here, with a `DeprecationWarning`.
"""

from ._atomic import ExclusiveLock, create_exclusive, write_atomic
from ._imports import import_string, moved_names, object_path, optional_import
from .contract._backends import GROUP as BACKENDS_GROUP
from .contract._backends import backend_names, load_backend

__all__ = [
    "BACKENDS_GROUP",
    "ExclusiveLock",
    "backend_names",
    "create_exclusive",
    "import_string",
    "load_backend",
    "object_path",
    "optional_import",
    "write_atomic",
]

__getattr__ = moved_names(
    __name__,
    {
        **{
            name: "pipekit_train.core.adapter"
            for name in ("check_ray_fit", "fit_with_ray_trainer", "ray_train_worker")
        },
        "RayTrainReport": "pipekit_train.core.train._ray_train",
    },
)
