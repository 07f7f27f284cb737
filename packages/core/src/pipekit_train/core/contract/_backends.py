"""Backends are discovered, not hardcoded: the `pipekit_train.backends` entry points.

Each adapter package declares one entry point per backend in its `pyproject.toml`:

```toml
[project.entry-points."pipekit_train.backends"]
equinox = "pipekit_train.equinox._entry:BACKEND"
```

The name is the backend name (what `--backend`, a run config's `backend` and
`Adapter.name` say); the value is a `BackendEntry`. Listing the backends reads only the
names (nothing is imported); `load_backend(name)` imports the one a run uses. The CLI
(`--backend`, `[model.factory]` and `[adapter]` tables, building the model operator and
the adapter) and the artifact's version table (`library_versions`) read it, so a new
backend needs no edit to core.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Final

from pipekit_train.core._errors import ConfigError
from pipekit_train.core._imports import import_string

__all__ = ["GROUP", "BackendEntry", "backend_names", "load_backend"]

GROUP: Final = "pipekit_train.backends"
"""The entry-point group a backend registers in."""


@dataclass(frozen=True)
class BackendEntry:
    """What one `pipekit_train.backends` entry point names.

    Attributes:
        name: the backend name; must equal the entry point's name and `Adapter.name`.
        adapter: `"module:Class"` of the `Adapter` (built with the run config's
            `[adapter.<name>]` keyword arguments).
        model_op: `"module:Class"` of the model operator the CLI wraps a model factory
            in (`Class(factory, seed=..., **kwargs)`).
        testing: the module with the backend's testing factories (`mlp`, `linear`), or
            None.
        distributions: the distributions whose versions the artifact records for this
            backend (besides python, numpy, grain, zarr, pipekit-train-core and the
            distribution that declares the entry point).
        install: how to install what the backend needs (shown when its import fails).
        supplied_kwargs: model-factory arguments the model operator passes itself (an
            Equinox factory's `key`); a run config's `model.kwargs` may not set them.
    """

    name: str
    adapter: str
    model_op: str
    testing: str | None = None
    distributions: tuple[str, ...] = field(default_factory=tuple)
    install: str = ""
    supplied_kwargs: tuple[str, ...] = ()

    def adapter_class(self) -> Any:
        """Import and return the adapter class.

        Raises:
            ImportError: its module (or one it needs) is not installed.
            ConfigError: the module has no such attribute.
        """
        return _attribute(self.adapter, f"{self.name}.adapter")

    def model_op_class(self) -> Any:
        """Import and return the model-operator class (raises as `adapter_class`)."""
        return _attribute(self.model_op, f"{self.name}.model_op")


def _attribute(path: str, field: str) -> Any:
    module, _, attr = path.partition(":")
    importlib.import_module(module)  # an ImportError propagates: the caller says what to install
    return import_string(path, field=f"{GROUP} entry {field}")


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for ep in importlib.metadata.entry_points(group=GROUP):
        found.setdefault(ep.name, ep)  # the first on sys.path wins, as for imports
    return found


def backend_names() -> tuple[str, ...]:
    """The registered backend names, sorted (nothing is imported)."""
    return tuple(sorted(_entry_points()))


def _distribution(ep: importlib.metadata.EntryPoint) -> str | None:
    dist = getattr(ep, "dist", None)
    return None if dist is None else str(dist.name)


@cache
def _load(name: str) -> tuple[BackendEntry, str | None]:
    eps = _entry_points()
    if name not in eps:
        raise ConfigError(
            f"No backend named {name!r} is installed. Received: backend={name!r}. Installed "
            f"backends: {list(backend_names())}. Install the package that provides it (the "
            f"shipped ones: pip install pipekit-train-{name}), or register one under the "
            f"{GROUP!r} entry-point group."
        )
    ep = eps[name]
    dist = _distribution(ep)
    try:
        entry = ep.load()
    except ImportError as exc:
        hint = f" Install what it needs: pip install {dist}." if dist else ""
        raise ConfigError(
            f"The {name!r} backend is registered by {dist or ep.value!r} but cannot be "
            f"imported ({exc}). Received: backend={name!r}.{hint}"
        ) from exc
    if not isinstance(entry, BackendEntry) or entry.name != name:
        raise ConfigError(
            f"The {GROUP!r} entry point {name!r} must name a BackendEntry with name={name!r}. "
            f"Received: {ep.value} = {entry!r}."
        )
    return entry, dist


def load_backend(name: str) -> BackendEntry:
    """The `BackendEntry` registered as `name` (imports its module).

    Raises:
        ConfigError: no such backend is installed, its module does not import, or the
            entry point names something else.
    """
    return _load(name)[0]


def backend_distribution(name: str) -> str | None:
    """The distribution that registered backend `name`, if known."""
    return _load(name)[1]


NUMPY: Final = BackendEntry(
    name="numpy",
    adapter="pipekit_train.core.testing:NumpyAdapter",
    model_op="pipekit_train.core.testing:NumpyLinearOp",
    testing="pipekit_train.core.testing._numpy_model",
    install="pip install pipekit-train-core",
)
"""Core's pure-numpy reference backend (a linear model; for tests and examples)."""
