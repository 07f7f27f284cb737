"""The contract for adapter authors: exactly what a backend package takes from core.

A user trains with `pipekit_train.core.TrainingLoop`; an adapter package (Equinox,
Lightning, `Torch()`, Keras, or a fifth one) imports core through this module and no
other. It holds what the adapters use and nothing more: a test reads the adapters'
sources and fails when one of them reaches another core module, or when a name here has
no adapter using it.

- **Base classes**: `Adapter` (any backend), `StepAdapter` + `StepBackend` (backends that
  expose a train step: `run_step_loop` runs the whole loop), `GroupStepBackend` (one
  step over the stacked states of a `SeedGroup`'s members; `StepAdapter.group_backend`;
  `step_members`: the members' own steps in turn),
  `Capabilities` (what is optional; `Capabilities.full()` for all of it).
- **The run**: `Plan` (the frozen description) and `RunLifecycle`, the one owner of a run
  (`with RunLifecycle(...) as run:` — restore or start and the data stream as a `Feed`,
  the end of each optimizer update with validation, checkpoints, preemption signals, the
  time budget and cross-process agreement, finish, abort); an adapter hands it callables
  with `RunLifecycle.bind`. `prefetch_depth` (how many batches to stage ahead),
  `is_core_dataset`, `check_seed`, `positive_int` (the constructors' int checks),
  `adjusts_learning_rate` (whether a plan's callbacks
  change the rate through the run's learning-rate scale).
- **The model**: `ModelOpBase` (the model operator every backend's op subclasses),
  `LAYOUTS`, `check_layout`, `to_channels_first_axes` and `to_channels_last_axes` (the
  `layout` option every op takes: a channels-first network on channels-last fields),
  `model_factory` (marks a factory the registry may call), `TrainingArtifact` (what a run
  hands downstream), `Checkpoint` (the policy), `Rollout` (the rollout-training spec).
- **Errors**: `ConfigError`, `CheckpointError`.
- **Checkpoints**: `open_store` (where steps live: atomic commits, digests, retention,
  torn-step fallback via `TornStepError`), `DirectoryCheckpointer` (the SHA-256-verified
  blob engine for backends without one), `HostBuffers` (reused host arrays for
  non-blocking snapshots), `Restored`. The engine interface and the stores are in
  `pipekit_train.core.checkpoint`.
- **The canonical spec**: `OptimizerSpec`/`optimizer_spec`, `check_schedule`,
  `learning_rate_at`, `Precision`, `resolve_precision`, `canonical_precision` and
  `translate_precision`. The name tables (`OPTIMIZERS`, `SCHEDULES`, `PRECISIONS`) are in
  `pipekit_train.core.spec`.
- **The step's metrics**: `GRAD_NORM`, `global_grad_norm` (one definition of the
  `grad_norm` metric for every backend).
- **Rollout training**: `RolloutSpec`, `rollout_spec`, `rollout_spec_of` (a `Rollout`'s),
  `prepare_rollout`, `rollout_loss`,
  `evaluates_as_rollout`, `NOISE_KEY`, `MEMBER_NOISE_KEY`, `FORCING_KEY`, and the two device loops `jax_rollout` and
  `torch_rollout`.
- **Embedding networks**: `check_deep_set_options` and `deep_set_shape_error`, the checks
  every backend's `deep_set` shares.
- **Registration and imports**: `BackendEntry` (what a `pipekit_train.backends` entry
  point names), `optional_import`, `object_path`.
- **Ray Train**: `fit_with_ray_trainer`, `ray_train_worker`, `check_ray_fit` (what each
  adapter's `ray` module builds on).

See the "Writing an adapter" page of the docs for a walk-through. Names this module held
before and no adapter uses (`OPTIMIZERS`, `SCHEDULES`, `PRECISIONS`, `NonFinitePolicy`,
`Checkpointer`, `CheckpointStore`, `TornCheckpointWarning`, `NotSupportedError`,
`PREFETCH_MIN_BYTES`) still import from here, with a `DeprecationWarning` naming their
home.
"""

from ._checks import check_seed, positive_int
from ._errors import CheckpointError, ConfigError
from ._imports import moved_names, object_path, optional_import
from .artifact._artifact import TrainingArtifact
from .checkpoint._engine import DirectoryCheckpointer, Restored
from .checkpoint._policy import Checkpoint
from .checkpoint._snapshot import HostBuffers
from .checkpoint._store import TornStepError, open_store
from .contract._adapter import Adapter, Capabilities, StepBackend
from .contract._backends import BackendEntry
from .data import is_core_dataset
from .data.trajectories._windows import FORCING_KEY
from .metrics._grad_norm import GRAD_NORM, global_grad_norm
from .model._embeddings import check_deep_set_options
from .model._embeddings import set_shape_error as deep_set_shape_error
from .model._layout import LAYOUTS, check_layout, to_channels_first_axes, to_channels_last_axes
from .model._operators import ModelOpBase
from .model._trust import model_factory
from .rollout._loops import jax_rollout, torch_rollout
from .rollout._noise import MEMBER_NOISE_KEY, NOISE_KEY
from .rollout._segments import prepare_rollout
from .rollout._step import RolloutSpec
from .rollout._train import evaluates_as_rollout, rollout_loss, rollout_spec, rollout_spec_of
from .run._lifecycle import RunLifecycle
from .run._prefetch import prefetch_depth
from .spec._lr_scale import adjusts_learning_rate
from .spec._optimizer import (
    OptimizerSpec,
    canonical_precision,
    optimizer_spec,
    resolve_precision,
    translate_precision,
)
from .spec._plan import Plan
from .spec._policies import Precision
from .spec._rollout import Rollout
from .spec._schedules import check_schedule, learning_rate_at
from .train._group_loop import GroupStepBackend, step_members
from .train._ray_train import check_ray_fit, fit_with_ray_trainer, ray_train_worker
from .train._step_loop import StepAdapter, run_step_loop

__all__ = [
    "GRAD_NORM",
    "GroupStepBackend",
    "LAYOUTS",
    "MEMBER_NOISE_KEY",
    "NOISE_KEY",
    "FORCING_KEY",
    "Adapter",
    "BackendEntry",
    "Capabilities",
    "Checkpoint",
    "CheckpointError",
    "ConfigError",
    "DirectoryCheckpointer",
    "HostBuffers",
    "ModelOpBase",
    "OptimizerSpec",
    "Plan",
    "Precision",
    "Restored",
    "Rollout",
    "RolloutSpec",
    "RunLifecycle",
    "StepAdapter",
    "StepBackend",
    "TornStepError",
    "TrainingArtifact",
    "adjusts_learning_rate",
    "canonical_precision",
    "check_deep_set_options",
    "check_layout",
    "check_ray_fit",
    "check_schedule",
    "check_seed",
    "deep_set_shape_error",
    "evaluates_as_rollout",
    "fit_with_ray_trainer",
    "global_grad_norm",
    "is_core_dataset",
    "jax_rollout",
    "learning_rate_at",
    "model_factory",
    "object_path",
    "open_store",
    "optimizer_spec",
    "optional_import",
    "positive_int",
    "prefetch_depth",
    "prepare_rollout",
    "ray_train_worker",
    "resolve_precision",
    "rollout_loss",
    "rollout_spec",
    "rollout_spec_of",
    "run_step_loop",
    "step_members",
    "to_channels_first_axes",
    "to_channels_last_axes",
    "torch_rollout",
    "translate_precision",
]

__getattr__ = moved_names(
    __name__,
    {
        "OPTIMIZERS": "pipekit_train.core.spec",
        "PRECISIONS": "pipekit_train.core.spec",
        "SCHEDULES": "pipekit_train.core.spec",
        "NonFinitePolicy": "pipekit_train.core.spec",
        "Checkpointer": "pipekit_train.core.checkpoint",
        "CheckpointStore": "pipekit_train.core.checkpoint",
        "TornCheckpointWarning": "pipekit_train.core.checkpoint",
        "NotSupportedError": "pipekit_train.core",
        "PREFETCH_MIN_BYTES": "pipekit_train.core.run._prefetch",
    },
)
