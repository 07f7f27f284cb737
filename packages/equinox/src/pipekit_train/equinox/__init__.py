"""pipekit-train-equinox."""

import importlib.metadata as _metadata

__version__ = _metadata.version("pipekit-train-equinox")

__all__ = ["__version__"]
