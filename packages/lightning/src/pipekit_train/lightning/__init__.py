"""pipekit-train-lightning."""

import importlib.metadata as _metadata

__version__ = _metadata.version("pipekit-train-lightning")

__all__ = ["__version__"]
