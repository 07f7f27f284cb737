"""pipekit-train-core: the carrier-agnostic core of pipekit-train.

Layer 0 (data), layer 1 (losses, metrics), layer 2 (callbacks, writers, checkpoint
policy), layer 3 (`TrainingLoop`, `TrainingArtifact`, `OnlineTrainer`), the adapter
machinery every backend reuses, and the pipekit handoffs (operators, model registry,
`NeuralForward`, `Cycle`). It never imports a backend framework.
"""

from typing import Any as _Any

from . import callbacks, data, losses, metrics, registry, writers
from ._adapter import Adapter
from ._artifact import TrainingArtifact
from ._checkpoint import Checkpoint
from ._checkpointing import (
    Checkpointer,
    DirectoryCheckpointer,
    Restored,
    TornCheckpointWarning,
    step_dirs,
)
from ._cycle import Cycle, NeuralForward, NonFiniteStateError
from ._driver import StepBackend, check_resume_key, restore_or_start, run_step_loop, stack_batches
from ._errors import CheckpointError, ConfigError, IntegrityError, PipekitError
from ._history import History
from ._imports import import_string, optional_import
from ._loop import TrainingLoop, resolve_optimizer_config
from ._online import OnlineTrainer
from ._operators import ModelOp, ModelOpBase, Operator, StatefulOperator, model_op_from_config
from ._plan import Plan
from ._runtime import RunContext, RunState
from ._schedules import check_schedule, learning_rate_at
from ._trust import UntrustedFactoryError, is_model_factory, model_factory
from .callbacks import (
    Callback,
    EarlyStopping,
    LambdaCallback,
    LearningRateLogger,
    NaNGuard,
    NonFiniteLossError,
    ProgressBar,
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
)


def __getattr__(name: str) -> _Any:
    # importlib.metadata costs ~0.1 s: resolve the version only when asked for.
    if name == "__version__":
        import importlib.metadata

        return importlib.metadata.version("pipekit-train-core")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Adapter",
    "ArrayDataset",
    "AsyncWriter",
    "BatchIterator",
    "CachedDataset",
    "Callback",
    "Checkpoint",
    "CheckpointError",
    "Checkpointer",
    "ConfigError",
    "CsvWriter",
    "Cycle",
    "Dataset",
    "DirectoryCheckpointer",
    "EarlyStopping",
    "FsspecModelRegistry",
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
    "MlflowWriter",
    "ModelOp",
    "ModelOpBase",
    "ModelRecord",
    "ModelRegistry",
    "NaNGuard",
    "NeuralForward",
    "NonFiniteLossError",
    "NonFiniteStateError",
    "Normalizer",
    "OnlineTrainer",
    "Operator",
    "PipekitError",
    "Plan",
    "ProgressBar",
    "RegistryError",
    "Restored",
    "RunContext",
    "RunState",
    "S3ModelRegistry",
    "SimulationDataset",
    "SimulationError",
    "StatefulOperator",
    "StepBackend",
    "Subset",
    "TensorBoardWriter",
    "TornCheckpointWarning",
    "TrainingArtifact",
    "TrainingLoop",
    "UnverifiedRecordWarning",
    "UntrustedFactoryError",
    "callbacks",
    "data",
    "losses",
    "make_batches",
    "metrics",
    "model_factory",
    "check_resume_key",
    "check_schedule",
    "import_string",
    "is_model_factory",
    "learning_rate_at",
    "model_op_from_config",
    "optional_import",
    "registry",
    "resolve_optimizer_config",
    "restore_or_start",
    "run_step_loop",
    "split",
    "stack_batches",
    "step_dirs",
    "writers",
    "__version__",
]
