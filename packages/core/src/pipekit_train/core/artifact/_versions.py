"""The version table of an artifact: python, core's libraries and the backend's.

The backend's distributions come from its `pipekit_train.backends` entry point
(`BackendEntry.distributions`, plus the distribution that declares it), so a new backend
is reported without an edit to core.
"""

from __future__ import annotations

import importlib.metadata
import sys

from pipekit_train.core._errors import ConfigError

__all__ = ["library_versions"]

_CORE: tuple[str, ...] = ("numpy", "grain", "zarr", "pipekit-train-core")


def _backend_distributions(backend: str) -> tuple[str, ...]:
    from pipekit_train.core.contract._backends import _load, backend_names

    if backend not in backend_names():
        return ()  # an adapter nobody registered (a test's ad-hoc subclass)
    try:
        entry, dist = _load(backend)
    except ConfigError:
        return ()
    return (*entry.distributions, *((dist,) if dist else ()))


def library_versions(backend: str) -> dict[str, str]:
    """Versions of python, numpy, grain, zarr, core and the backend's distributions.

    Distributions that are not installed are left out.
    """
    out: dict[str, str] = {"python": sys.version.split()[0]}
    for name in dict.fromkeys((*_CORE, *_backend_distributions(backend))):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out
