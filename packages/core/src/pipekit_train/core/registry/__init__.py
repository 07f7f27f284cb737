"""The model registry: versioned, integrity-checked storage of trained model operators.

`LocalModelRegistry(root)` and `S3ModelRegistry("s3://bucket/prefix")` are the same
fsspec-backed `FsspecModelRegistry`; see `_registry.py` for the layout and the
concurrency design.
"""

from pipekit_train.core.model._trust import UntrustedFactoryError, model_factory

from ._record import ModelRecord
from ._registry import (
    FsspecModelRegistry,
    LocalModelRegistry,
    ModelRegistry,
    RegistryError,
    S3ModelRegistry,
    UnverifiedRecordWarning,
)

__all__ = [
    "FsspecModelRegistry",
    "LocalModelRegistry",
    "ModelRecord",
    "ModelRegistry",
    "RegistryError",
    "S3ModelRegistry",
    "UnverifiedRecordWarning",
    "UntrustedFactoryError",
    "model_factory",
]
