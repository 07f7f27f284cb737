"""pipekit-train-keras."""

import importlib.metadata as _metadata

__version__ = _metadata.version("pipekit-train-keras")

__all__ = ["__version__"]
