"""The contract for adapter authors: everything a backend needs from core.

A user trains with `pipekit_train.core.TrainingLoop`; an adapter author implements the
classes here and uses the shared machinery, and imports nothing private from core.

- **Base classes**: `Adapter` (any backend), `StepAdapter` + `StepBackend` (backends that
  expose a train step: core runs the whole loop), `Capabilities` (what is optional),
  `NotSupportedError` (the default of every optional member).
- **The run**: `Plan` (the frozen description), `RunContext` (callbacks, writers, history,
  schedules, the per-step sequence `RunContext.after_steps`, the artifact), `RunState`
  (what callbacks see), `run_step_loop`, `restore_or_start` (the one resume path),
  `abort_run`, `check_resume_key`, `stack_batches`.
- **Checkpoints**: `Checkpointer` (the engine interface), `DirectoryCheckpointer` (the
  atomic SHA-256-verified store for backends without an engine, local or at any fsspec
  URI), `RemoteSteps` (step folders at a URI, committed by a marker written last),
  `HostBuffers` (reused host arrays for non-blocking snapshots), `Restored`,
  `TornCheckpointWarning`, `step_dirs`, `fsync_dir`; step-folder digests
  (`FOLDER_DIGEST`, `seal_folder`, `check_folder`, `sha256_file`).
- **The canonical spec**: `OptimizerSpec`/`optimizer_spec` and `OPTIMIZERS` (names and
  hyperparameters every backend runs the same way), `SCHEDULES`, `check_schedule`,
  `learning_rate_at`, `peak_learning_rate` (learning-rate curves in plain Python),
  `PRECISIONS`/`resolve_precision`/`canonical_precision` and the typed policies
  `Precision` and `NonFinitePolicy`.
- **Registration**: `BackendEntry`, what a `pipekit_train.backends` entry point names
  (`BACKENDS_GROUP`); `backend_names`, `load_backend`.
- **Helpers**: `is_core_dataset`, `describe_callable`, `import_string`, `object_path`,
  `optional_import`, `default_fetch`, `check_seed`.

See the "Writing an adapter" page of the docs for a walk-through.
"""

from ._adapter import Adapter, Capabilities, NotSupportedError, StepAdapter, StepBackend
from ._backends import GROUP as BACKENDS_GROUP
from ._backends import BackendEntry, backend_names, load_backend
from ._checkpointing import (
    Checkpointer,
    DirectoryCheckpointer,
    Restored,
    TornCheckpointWarning,
    fsync_dir,
    step_dirs,
)
from ._driver import abort_run, check_resume_key, restore_or_start, run_step_loop, stack_batches
from ._folder_digest import FOLDER_DIGEST, check_folder, seal_folder, sha256_file
from ._imports import import_string, object_path, optional_import
from ._operators import check_seed
from ._plan import Plan, describe_callable, is_core_dataset, steps_per_epoch
from ._policies import NonFinitePolicy, Precision
from ._remote import RemoteSteps
from ._runtime import RunContext, RunState, default_fetch
from ._schedules import SCHEDULES, check_schedule, learning_rate_at, peak_learning_rate
from ._snapshot import HostBuffers
from ._spec import (
    OPTIMIZERS,
    PRECISIONS,
    OptimizerSpec,
    canonical_precision,
    optimizer_spec,
    resolve_optimizer_config,
    resolve_precision,
)

__all__ = [
    "BACKENDS_GROUP",
    "BackendEntry",
    "backend_names",
    "load_backend",
    "OPTIMIZERS",
    "PRECISIONS",
    "SCHEDULES",
    "Adapter",
    "Capabilities",
    "Checkpointer",
    "DirectoryCheckpointer",
    "HostBuffers",
    "NonFinitePolicy",
    "NotSupportedError",
    "OptimizerSpec",
    "Plan",
    "Precision",
    "RemoteSteps",
    "Restored",
    "RunContext",
    "RunState",
    "StepAdapter",
    "StepBackend",
    "TornCheckpointWarning",
    "abort_run",
    "check_resume_key",
    "canonical_precision",
    "check_schedule",
    "check_seed",
    "default_fetch",
    "describe_callable",
    "fsync_dir",
    "FOLDER_DIGEST",
    "check_folder",
    "seal_folder",
    "sha256_file",
    "import_string",
    "is_core_dataset",
    "learning_rate_at",
    "object_path",
    "optimizer_spec",
    "optional_import",
    "peak_learning_rate",
    "resolve_optimizer_config",
    "resolve_precision",
    "restore_or_start",
    "run_step_loop",
    "stack_batches",
    "step_dirs",
    "steps_per_epoch",
]
