"""pipekit-train-core: the carrier-agnostic core of pipekit-train.

Layer 0 (data), layer 1 (losses, metrics), layer 2 (callbacks, writers, checkpoint
policy), layer 3 (`TrainingLoop`, `TrainingArtifact`, `OnlineTrainer`), the pipekit handoffs (operators, model registry,
`NeuralForward`, `Cycle`). `pipekit_train.core.adapter` is the contract for adapter
authors. It never imports a backend framework.
"""

from typing import Any as _Any

from . import adapter, callbacks, data, losses, metrics, registry, writers
from ._adapter import NotSupportedError
from ._artifact import TrainingArtifact
from ._checkpoint import Checkpoint
from ._checkpointing import TornCheckpointWarning
from ._cycle import Cycle, NeuralForward, NonFiniteStateError
from ._errors import CheckpointError, ConfigError, IntegrityError, PipekitError
from ._evaluation import evaluate
from ._heads import Gaussian
from ._history import History
from ._loop import TrainingLoop
from ._lr_find import LRFindResult, lr_find
from ._mixture import Mixture
from ._online import OnlineTrainer
from ._operators import ModelOp, ModelOpBase, Operator, StatefulOperator, model_op_from_config
from ._policies import NonFinitePolicy, Precision
from ._preemption import PREEMPTED_EXIT_STATUS, Preempted
from ._runtime import RunState
from ._trust import UntrustedFactoryError, is_model_factory, model_factory
from .callbacks import (
    Callback,
    EarlyStopping,
    LambdaCallback,
    LearningRateLogger,
    NaNGuard,
    NonFiniteLossError,
    ProgressBar,
    ReduceLROnPlateau,
)
from .data import (
    ArrayDataset,
    BatchIterator,
    CachedDataset,
    Dataset,
    IterableDataset,
    Normalizer,
    SimulationDataset,
    SimulationError,
    Subset,
    as_supervised,
    make_batches,
    split,
)
from .losses import Loss
from .registry import (
    FsspecModelRegistry,
    LocalModelRegistry,
    ModelRecord,
    ModelRegistry,
    RegistryError,
    S3ModelRegistry,
    UnverifiedRecordWarning,
)
from .writers import (
    AsyncWriter,
    CsvWriter,
    JsonlWriter,
    MemoryWriter,
    MetricWriter,
    MlflowWriter,
    TensorBoardWriter,
    WandbWriter,
)


def __getattr__(name: str) -> _Any:
    # importlib.metadata costs ~0.1 s: resolve the version only when asked for.
    if name == "__version__":
        import importlib.metadata

        return importlib.metadata.version("pipekit-train-core")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "PREEMPTED_EXIT_STATUS",
    "Preempted",
    "ArrayDataset",
    "AsyncWriter",
    "BatchIterator",
    "CachedDataset",
    "Callback",
    "Checkpoint",
    "CheckpointError",
    "ConfigError",
    "CsvWriter",
    "Cycle",
    "Dataset",
    "EarlyStopping",
    "FsspecModelRegistry",
    "Gaussian",
    "History",
    "IntegrityError",
    "IterableDataset",
    "JsonlWriter",
    "LambdaCallback",
    "LearningRateLogger",
    "LocalModelRegistry",
    "Loss",
    "MemoryWriter",
    "MetricWriter",
    "Mixture",
    "MlflowWriter",
    "ModelOp",
    "ModelOpBase",
    "ModelRecord",
    "ModelRegistry",
    "NotSupportedError",
    "NaNGuard",
    "NeuralForward",
    "NonFiniteLossError",
    "NonFinitePolicy",
    "NonFiniteStateError",
    "Normalizer",
    "OnlineTrainer",
    "Operator",
    "PipekitError",
    "Precision",
    "ProgressBar",
    "ReduceLROnPlateau",
    "RegistryError",
    "RunState",
    "S3ModelRegistry",
    "SimulationDataset",
    "SimulationError",
    "StatefulOperator",
    "Subset",
    "TensorBoardWriter",
    "TornCheckpointWarning",
    "TrainingArtifact",
    "TrainingLoop",
    "LRFindResult",
    "UnverifiedRecordWarning",
    "UntrustedFactoryError",
    "WandbWriter",
    "callbacks",
    "data",
    "evaluate",
    "losses",
    "lr_find",
    "make_batches",
    "metrics",
    "is_model_factory",
    "model_factory",
    "model_op_from_config",
    "registry",
    "split",
    "writers",
    "__version__",
    "adapter",
    "as_supervised",
]
