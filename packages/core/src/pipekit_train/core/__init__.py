"""pipekit-train-core: the carrier-agnostic core of pipekit-train.

It never imports a backend framework. A user trains with `TrainingLoop` (this module's
names); an adapter package takes core only through `pipekit_train.core.adapter`.

Core is a house of rooms in layers; a room imports only from its own layer or below, and
no two rooms import each other (`packages/core/tests/test_core_layers.py` checks both):

| layer | rooms | what they hold |
|---|---|---|
| 0 | `_errors`, `_atomic`, `_imports`, `_checks`, `_json` | leaves: errors, atomic files, imports by name, checks, JSON |
| 1 | `data`, `checkpoint`, `distributions`, `diagnostics`, `writers` | datasets, trajectories, the cache and the batching engine; checkpoint stores, engines, policy and lease; what a model's output means as a distribution, with its mathematics; SBI calibration diagnostics; metric writers |
| 2 | `losses`, `metrics` | losses against the array API; metrics |
| 3 | `spec` | the frozen description of a run (`Plan`) and its vocabulary |
| 4 | `contract` | the adapter base classes and backend discovery |
| 5 | `model` | model operators (`ModelOpBase`), trusted factories |
| 6 | `rollout` | trained networks as forward operators and posteriors (`NeuralForward`, `Cycle`, `PosteriorEnsemble`), the device rollout and rollout training |
| 7 | `callbacks`, `artifact` | callbacks, the monitors among them; what a run hands downstream (`TrainingArtifact`, `History`, `evaluate`) |
| 8 | `run` | the run engine (`RunLifecycle`, `RunState`) |
| 9 | `train` | the drivers: `TrainingLoop`, `SeedGroup`, `OnlineTrainer`, the step loop, `lr_find`, Ray Train |
| 10 | this module, `adapter`, `utils`, `registry` | the user's API, the adapters' contract, helpers, the model registry |
| 11 | `cli`, `testing` | the command line; test utilities and the conformance suite |

Words with one meaning each: a *plan* is the frozen, validated description of one run
(`Plan`; `Plan.to_json()` is its JSON form, `RunState.plan`); a device rollout's steps
and segments are a `SegmentedRollout` (formerly `RolloutPlan`). A *spec* is a frozen,
validated description of one thing that a backend translates and never re-checks: the
run's vocabulary (the `spec` room), an optimizer (`OptimizerSpec`), a rollout step
(`RolloutSpec`), an array (`ArraySpec`, a dataset's `element_spec`). A *head* names how a
model's output is read (`distributions`). `RunState` is the callbacks' handle on a run:
it reads the run and takes three requests (`set_lr_scale`, `log`, `request_stop`).
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
from .train._seed_group import SeedGroup
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
    "SeedGroup",
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
