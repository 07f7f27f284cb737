"""pipekit-train-sweep."""

import importlib.metadata as _metadata

__version__ = _metadata.version("pipekit-train-sweep")

__all__ = ["__version__"]
