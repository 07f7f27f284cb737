"""pipekit-train-core: the carrier-agnostic core of pipekit-train.

Layer 0 (data), layer 1 (losses, metrics), layer 2 (callbacks, writers, checkpoint
policy), layer 3 (`TrainingLoop`, `TrainingArtifact`, `OnlineTrainer`), the pipekit handoffs (operators, model registry,
`NeuralForward`, `Cycle`). `pipekit_train.core.adapter` is the contract for adapter
authors. It never imports a backend framework.
"""

from typing import Any as _Any

from . import (
    adapter,
    callbacks,
    data,
    diagnostics,
    distributions,
    losses,
    metrics,
    registry,
    writers,
)
from ._errors import CheckpointError, ConfigError, IntegrityError, PipekitError
from .artifact import History, TrainingArtifact, evaluate
from .callbacks import (
    CalibrationMonitor,
    Callback,
    EarlyStopping,
    LambdaCallback,
    LearningRateLogger,
    NaNGuard,
    NonFiniteLossError,
    ProgressBar,
    ReduceLROnPlateau,
    RolloutMonitor,
)
from .checkpoint._engine import TornCheckpointWarning
from .checkpoint._lease import LeaseError
from .checkpoint._policy import Checkpoint
from .contract._adapter import NotSupportedError
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
    Trajectories,
    TrajectoryWindows,
    as_supervised,
    make_batches,
    split,
    split_trajectories,
)
from .distributions import (
    BoxPrior,
    Ensemble,
    Flow,
    Gaussian,
    LikelihoodPosterior,
    Mixture,
    RejectionError,
    smc_sample,
)
from .losses import Loss
from .model._operators import ModelOp, ModelOpBase, Operator, StatefulOperator, model_op_from_config
from .model._trust import UntrustedFactoryError, is_model_factory, model_factory
from .registry import (
    FsspecModelRegistry,
    LocalModelRegistry,
    ModelRecord,
    ModelRegistry,
    RegistryError,
    S3ModelRegistry,
    UnverifiedRecordWarning,
)
from .rollout._cycle import Cycle, NeuralForward, NonFiniteStateError
from .rollout._posterior import PosteriorEnsemble
from .rollout._validation import RolloutReport, rollout_validation
from .run._context import RunState
from .run._preemption import PREEMPTED_EXIT_STATUS, Preempted
from .spec._policies import NonFinitePolicy, Precision
from .spec._rollout import Rollout, RolloutSchedule
from .train._lr_find import LRFindResult, lr_find
from .train._online import OnlineTrainer
from .train._training_loop import TrainingLoop
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
    "ArrayDataset",
    "AsyncWriter",
    "BatchIterator",
    "CachedDataset",
    "CalibrationMonitor",
    "Callback",
    "Checkpoint",
    "CheckpointError",
    "ConfigError",
    "CsvWriter",
    "Cycle",
    "Dataset",
    "EarlyStopping",
    "BoxPrior",
    "Ensemble",
    "Flow",
    "FsspecModelRegistry",
    "Gaussian",
    "LikelihoodPosterior",
    "History",
    "IntegrityError",
    "IterableDataset",
    "JsonlWriter",
    "LRFindResult",
    "LambdaCallback",
    "LearningRateLogger",
    "LeaseError",
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
    "NaNGuard",
    "NeuralForward",
    "NonFiniteLossError",
    "NonFinitePolicy",
    "NonFiniteStateError",
    "Normalizer",
    "NotSupportedError",
    "OnlineTrainer",
    "Operator",
    "PipekitError",
    "PosteriorEnsemble",
    "Precision",
    "Preempted",
    "ProgressBar",
    "ReduceLROnPlateau",
    "RegistryError",
    "RejectionError",
    "Rollout",
    "RolloutMonitor",
    "RolloutReport",
    "RolloutSchedule",
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
    "Trajectories",
    "TrajectoryWindows",
    "UntrustedFactoryError",
    "UnverifiedRecordWarning",
    "WandbWriter",
    "__version__",
    "adapter",
    "as_supervised",
    "callbacks",
    "data",
    "diagnostics",
    "distributions",
    "evaluate",
    "is_model_factory",
    "losses",
    "lr_find",
    "make_batches",
    "metrics",
    "model_factory",
    "model_op_from_config",
    "registry",
    "rollout_validation",
    "split",
    "smc_sample",
    "split_trajectories",
    "writers",
]
