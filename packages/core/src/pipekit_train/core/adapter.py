"""The contract for adapter authors: everything a backend needs from core.

A user trains with `pipekit_train.core.TrainingLoop`; an adapter author implements the
classes here and uses the shared machinery, and imports nothing private from core.

- **Base classes**: `Adapter` (any backend), `StepAdapter` + `StepBackend` (backends that
  expose a train step: core runs the whole loop), `Capabilities` (what is optional),
  `NotSupportedError` (the default of every optional member).
- **The run**: `Plan` (the frozen description), `RunLifecycle` (owns a run: restore or
  start and the data stream, the end of each optimizer update — with preemption
  signals, the time budget and the checkpoint cadences —, finish and abort; an adapter
  hands it callables), `RunContext` (its state: metrics routing, validation, the
  checkpoint schedule and meta, the artifact; its docstring lists what an adapter
  uses), `run_step_loop` (the whole loop over a `StepBackend`).
- **Checkpoints**: `Checkpointer` (the engine interface), `CheckpointStore` (where steps
  live: `LocalStore`, `FsspecStore`, chosen by `open_store`; atomic commits, folder
  digests, retention, torn-step fallback via `TornStepError`, write failures as one
  `CheckpointError`), `DirectoryCheckpointer` (the SHA-256-verified blob engine for
  backends without an engine), `HostBuffers` (reused host arrays for non-blocking
  snapshots), `Restored`, `TornCheckpointWarning`, `step_dirs`.
- **The canonical spec**: `OptimizerSpec`/`optimizer_spec` and `OPTIMIZERS` (names and
  hyperparameters every backend runs the same way), `SCHEDULES`, `check_schedule`,
  `learning_rate_at` (learning-rate curves in plain Python),
  `PRECISIONS`/`resolve_precision`/`canonical_precision` and the typed policies
  `Precision` and `NonFinitePolicy`.
- **Registration**: `BackendEntry`, what a `pipekit_train.backends` entry point names
  (`BACKENDS_GROUP`); `backend_names`, `load_backend`.
- **Metrics of the step**: `GRAD_NORM`, `global_grad_norm` (the `grad_norm` metric of
  `TrainingLoop(log_grad_norm=True)`, one definition for every backend).
- **Helpers**: `adjusts_learning_rate` (a plan's callbacks change the rate through
  the run's learning-rate scale, `RunContext.bind_lr_scale`), `is_core_dataset`, `describe_callable`, `import_string`, `object_path`,
  `optional_import`, `check_seed`.

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
    step_dirs,
)
from ._driver import run_step_loop
from ._grad_norm import GRAD_NORM, global_grad_norm
from ._imports import import_string, object_path, optional_import
from ._lifecycle import RunLifecycle
from ._lr_scale import adjusts_learning_rate
from ._operators import check_seed
from ._plan import Plan, describe_callable, is_core_dataset
from ._policies import NonFinitePolicy, Precision
from ._runtime import RunContext
from ._schedules import SCHEDULES, check_schedule, learning_rate_at
from ._snapshot import HostBuffers
from ._spec import (
    OPTIMIZERS,
    PRECISIONS,
    OptimizerSpec,
    canonical_precision,
    optimizer_spec,
    resolve_precision,
)
from ._store import CheckpointStore, FsspecStore, LocalStore, TornStepError, open_store

__all__ = [
    "GRAD_NORM",
    "global_grad_norm",
    "BACKENDS_GROUP",
    "BackendEntry",
    "backend_names",
    "load_backend",
    "OPTIMIZERS",
    "PRECISIONS",
    "SCHEDULES",
    "Adapter",
    "adjusts_learning_rate",
    "Capabilities",
    "CheckpointStore",
    "Checkpointer",
    "DirectoryCheckpointer",
    "FsspecStore",
    "HostBuffers",
    "LocalStore",
    "NonFinitePolicy",
    "NotSupportedError",
    "OptimizerSpec",
    "Plan",
    "Precision",
    "Restored",
    "RunContext",
    "RunLifecycle",
    "StepAdapter",
    "StepBackend",
    "TornCheckpointWarning",
    "TornStepError",
    "canonical_precision",
    "check_schedule",
    "check_seed",
    "describe_callable",
    "import_string",
    "is_core_dataset",
    "learning_rate_at",
    "object_path",
    "open_store",
    "optimizer_spec",
    "optional_import",
    "resolve_precision",
    "run_step_loop",
    "step_dirs",
]
