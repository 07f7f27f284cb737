"""pipekit-train-core."""

import importlib.metadata as _metadata

__version__ = _metadata.version("pipekit-train-core")

__all__ = ["__version__"]
