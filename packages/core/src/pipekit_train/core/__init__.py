"""pipekit-train-core: the carrier-agnostic core of pipekit-train.

Layer 0 (data), layer 1 (losses, metrics), layer 2 (callbacks, writers, checkpoint
policy), layer 3 (`TrainingLoop`, `TrainingArtifact`, `OnlineTrainer`), the adapter
machinery every backend reuses, and the pipekit handoffs (operators, model registry,
`NeuralForward`, `Cycle`). It never imports a backend framework.
"""

import importlib.metadata as _metadata

from ._adapter import Adapter
from ._artifact import TrainingArtifact
from ._checkpoint import Checkpoint
from ._cycle import Cycle, NeuralForward, NonFiniteStateError
from ._checkpointing import Checkpointer, DirectoryCheckpointer, Restored, TornCheckpointWarning
from ._driver import StepBackend, run_step_loop, stack_batches
from ._errors import CheckpointError, ConfigError, IntegrityError, PipekitError
from ._history import History
from ._loop import TrainingLoop, resolve_optimizer_config
from ._online import OnlineTrainer
from ._operators import ModelOp, ModelOpBase, Operator, StatefulOperator, model_op_from_config
from ._plan import Plan
from ._runtime import RunContext, RunState
from .registry import (
    FsspecModelRegistry,
    LocalModelRegistry,
    ModelRecord,
    ModelRegistry,
    RegistryError,
    S3ModelRegistry,
)

__version__ = _metadata.version("pipekit-train-core")

__all__ = [
    "Adapter",
    "Checkpoint",
    "CheckpointError",
    "Checkpointer",
    "Cycle",
    "FsspecModelRegistry",
    "LocalModelRegistry",
    "ModelRecord",
    "ModelRegistry",
    "NeuralForward",
    "NonFiniteStateError",
    "RegistryError",
    "S3ModelRegistry",
    "ConfigError",
    "DirectoryCheckpointer",
    "History",
    "IntegrityError",
    "ModelOp",
    "ModelOpBase",
    "OnlineTrainer",
    "Operator",
    "PipekitError",
    "Plan",
    "Restored",
    "RunContext",
    "RunState",
    "StatefulOperator",
    "StepBackend",
    "TornCheckpointWarning",
    "TrainingArtifact",
    "TrainingLoop",
    "__version__",
    "model_op_from_config",
    "resolve_optimizer_config",
    "run_step_loop",
    "stack_batches",
]
