"""The contract for adapter authors: everything a backend needs from core.

A user trains with `pipekit_train.core.TrainingLoop`; an adapter author implements the
classes here and uses the shared machinery, and imports nothing private from core.

- **Base classes**: `Adapter` (any backend), `StepAdapter` + `StepBackend` (backends that
  expose a train step: core's `run_step_loop` runs the whole loop), `Capabilities` (what
  is optional; `Capabilities.full()` for all of it), `NotSupportedError` (the default of
  every optional member).
- **The run**: `Plan` (the frozen description) and `RunLifecycle`, the one owner of a run
  (`with RunLifecycle(...) as run:` — restore or start and the data stream as a `Feed`,
  the end of each optimizer update with validation, checkpoints, preemption signals,
  the time budget and cross-process agreement, finish, abort); an adapter hands it
  callables with `RunLifecycle.bind`.
- **Checkpoints**: `Checkpointer` (the engine interface), `CheckpointStore` (where steps
  live, chosen by `open_store`: atomic commits, folder digests, retention, torn-step
  fallback via `TornStepError`, write failures as one `CheckpointError`),
  `DirectoryCheckpointer` (the SHA-256-verified blob engine for backends without an
  engine), `HostBuffers` (reused host arrays for non-blocking snapshots), `Restored`,
  `TornCheckpointWarning`. The store implementations and `step_dirs` are in
  `pipekit_train.core.checkpoint`.
- **The canonical spec**: `OptimizerSpec`/`optimizer_spec` and `OPTIMIZERS` (names and
  hyperparameters every backend runs the same way), `SCHEDULES`, `check_schedule`,
  `learning_rate_at` (learning-rate curves in plain Python),
  `PRECISIONS`/`resolve_precision`/`canonical_precision`/`translate_precision` and the
  typed policies `Precision` and `NonFinitePolicy`.
- **Registration**: `BackendEntry`, what a `pipekit_train.backends` entry point names
  (listing and loading them: `pipekit_train.core.utils`).
- **Metrics of the step**: `GRAD_NORM`, `global_grad_norm` (the `grad_norm` metric of
  `TrainingLoop(log_grad_norm=True)`, one definition for every backend).
- **Helpers**: `adjusts_learning_rate` (whether a plan's callbacks change the rate
  through the run's learning-rate scale), `is_core_dataset`, `check_seed`.
- **Embedding networks**: `check_deep_set_options` and `deep_set_shape_error`, the checks
  every backend's `deep_set` factory shares.

See the "Writing an adapter" page of the docs for a walk-through.
"""

from ._checks import check_seed
from .checkpoint._engine import (
    Checkpointer,
    DirectoryCheckpointer,
    Restored,
    TornCheckpointWarning,
)
from .checkpoint._snapshot import HostBuffers
from .checkpoint._store import CheckpointStore, TornStepError, open_store
from .contract._adapter import Adapter, Capabilities, NotSupportedError, StepBackend
from .contract._backends import BackendEntry
from .data import is_core_dataset
from .metrics._grad_norm import GRAD_NORM, global_grad_norm
from .model._embeddings import check_deep_set_options
from .model._embeddings import set_shape_error as deep_set_shape_error
from .run._lifecycle import RunLifecycle
from .run._prefetch import PREFETCH_MIN_BYTES, prefetch_depth
from .spec._lr_scale import adjusts_learning_rate
from .spec._optimizer import (
    OPTIMIZERS,
    PRECISIONS,
    OptimizerSpec,
    canonical_precision,
    optimizer_spec,
    resolve_precision,
    translate_precision,
)
from .spec._plan import Plan
from .spec._policies import NonFinitePolicy, Precision
from .spec._schedules import SCHEDULES, check_schedule, learning_rate_at
from .train._step_loop import StepAdapter, run_step_loop

__all__ = [
    "GRAD_NORM",
    "global_grad_norm",
    "BackendEntry",
    "OPTIMIZERS",
    "PREFETCH_MIN_BYTES",
    "PRECISIONS",
    "SCHEDULES",
    "Adapter",
    "adjusts_learning_rate",
    "Capabilities",
    "CheckpointStore",
    "Checkpointer",
    "DirectoryCheckpointer",
    "HostBuffers",
    "NonFinitePolicy",
    "NotSupportedError",
    "OptimizerSpec",
    "Plan",
    "Precision",
    "Restored",
    "RunLifecycle",
    "StepAdapter",
    "StepBackend",
    "TornCheckpointWarning",
    "TornStepError",
    "canonical_precision",
    "check_deep_set_options",
    "check_seed",
    "check_schedule",
    "deep_set_shape_error",
    "is_core_dataset",
    "learning_rate_at",
    "open_store",
    "optimizer_spec",
    "prefetch_depth",
    "resolve_precision",
    "translate_precision",
    "run_step_loop",
]
