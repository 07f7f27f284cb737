"""Choosing the Keras backend before keras is imported.

Keras fixes its backend when it is first imported, from `KERAS_BACKEND` or
`~/.keras/keras.json`, and defaults to tensorflow, which pipekit-train-keras does not
support. When neither names a backend that is installed, `configure()` sets
`KERAS_BACKEND` to `jax` (or `torch` when only torch is installed). It never overrides an
explicit `KERAS_BACKEND`, and does nothing once keras is imported.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

__all__ = ["SUPPORTED", "backend_name", "configure"]

SUPPORTED = ("jax", "torch")


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _configured_backend() -> str | None:
    home = os.environ.get("KERAS_HOME") or str(Path.home() / ".keras")
    try:
        with open(Path(home) / "keras.json") as fh:
            value = json.load(fh).get("backend")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def configure() -> None:
    """Pick `jax`/`torch` for Keras if nothing usable is configured (see the module doc)."""
    if "keras" in sys.modules or os.environ.get("KERAS_BACKEND"):
        return
    configured = _configured_backend()
    if configured in SUPPORTED and _installed(configured):
        return
    for name in SUPPORTED:
        if _installed(name):
            os.environ["KERAS_BACKEND"] = name
            return


def backend_name() -> str:
    """The Keras backend in use (imports keras).

    Raises:
        ImportError: Keras cannot be imported with its configured backend (e.g. the default
            tensorflow is not installed), or runs on a backend this package does not support;
            the message names the extra to install and `KERAS_BACKEND`.
    """
    configure()
    try:
        import keras
    except ImportError as exc:
        # Keras imports its backend when it is imported: with KERAS_BACKEND=tensorflow (its
        # default) and no tensorflow installed this is a bare "No module named 'tensorflow'".
        requested = os.environ.get("KERAS_BACKEND") or _configured_backend() or "tensorflow"
        raise ImportError(
            f"Keras could not be imported with its backend ({exc}). Received: "
            f"KERAS_BACKEND={requested!r}. pipekit-train-keras runs Keras on jax or torch: "
            'install an extra (`pip install "pipekit-train-keras[jax]"` or '
            '`pip install "pipekit-train-keras[torch]"`) and set KERAS_BACKEND=jax or '
            "KERAS_BACKEND=torch (or unset it) before keras is imported."
        ) from exc

    name = keras.backend.backend()
    if name not in SUPPORTED:
        raise ImportError(
            f"pipekit-train-keras runs Keras on the jax or torch backend. Received: "
            f'KERAS_BACKEND={name!r}. Install an extra (`pip install "pipekit-train-keras[jax]"` '
            "or `[torch]`) and set KERAS_BACKEND=jax or KERAS_BACKEND=torch before importing keras."
        )
    return name
