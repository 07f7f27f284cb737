"""The library versions an artifact records."""

from __future__ import annotations

import importlib.metadata
import sys

__all__ = ["library_versions"]

_BACKEND_PACKAGES = {
    "equinox": ("jax", "jaxlib", "equinox", "optax", "orbax-checkpoint", "pipekit-train-equinox"),
    "lightning": ("torch", "lightning", "safetensors", "pipekit-train-lightning"),
    "keras": ("keras", "jax", "torch", "pipekit-train-keras"),
    "numpy": (),
}


def library_versions(backend: str) -> dict[str, str]:
    """Versions of numpy, grain, zarr, core and the backend's libraries."""
    names = (
        "python",
        "numpy",
        "grain",
        "zarr",
        "pipekit-train-core",
        *_BACKEND_PACKAGES.get(backend, ()),
    )
    out: dict[str, str] = {}
    for name in names:
        if name == "python":
            out[name] = sys.version.split()[0]
            continue
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out
