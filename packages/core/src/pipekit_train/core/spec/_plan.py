"""`Plan`: the frozen, validated description of one training run."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipekit_train.core.checkpoint._policy import Checkpoint
from pipekit_train.core.data.datasets._dataset import is_core_dataset, is_stream
from pipekit_train.core.spec._signals import DEFAULT_PREEMPTION_SIGNALS

from ._policies import NonFinitePolicy
from ._rollout import Rollout

if TYPE_CHECKING:
    from pipekit_train.core.callbacks import Callback
    from pipekit_train.core.contract._adapter import Adapter
    from pipekit_train.core.data import Dataset, IterableDataset, Normalizer
    from pipekit_train.core.model._operators import ModelOp
    from pipekit_train.core.writers import MetricWriter

__all__ = ["RESUME_KEY_FIELDS", "Plan", "steps_per_epoch"]

RESUME_KEY_FIELDS: tuple[str, ...] = (
    "backend",
    "model",
    "loss",
    "optimizer",
    "batch_size",
    "accumulate_grad_batches",
    "seed",
    "shuffle",
    "rollout",
)
"""The plan fields a checkpoint must match to be resumed (`Plan.resume_key`), in order."""


def _describe(fn: Any) -> Any:
    """A JSON description of a loss, metric or callable."""
    describe = getattr(fn, "describe", None)
    if callable(describe):
        return describe()
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if module and qualname and "<" not in qualname:
        return f"{module}:{qualname}"
    return repr(fn)


def steps_per_epoch(
    data: Any, batch_size: int, drop_remainder: bool, accumulate: int = 1
) -> int | None:
    """Optimizer steps in one epoch of a sized dataset (None for streams / native loaders).

    With gradient accumulation a step takes `accumulate` batches, so an epoch has
    `batches // accumulate` steps (accumulation groups run on across epoch ends).
    """
    if not is_core_dataset(data) or is_stream(data):
        return None
    n = len(data)
    batches = n // batch_size if drop_remainder else math.ceil(n / batch_size)
    return max(1, batches // accumulate)


def _describe_data(data: Any) -> dict[str, Any]:
    if data is None:
        return {}
    info: dict[str, Any] = {"type": type(data).__name__}
    if is_core_dataset(data) and not is_stream(data):
        info["length"] = len(data)
    fingerprint = getattr(data, "fingerprint", None)
    if callable(fingerprint):
        try:
            info["fingerprint"] = fingerprint()
        except Exception:  # a fingerprint is informative only
            pass
    return info


@dataclass(frozen=True)
class Plan:
    """Everything `TrainingLoop` validated, frozen for the adapter.

    Holds the live objects the adapter needs (model operator, datasets, callbacks,
    writers) and serialises to JSON with `to_json()` for artifacts, registries and
    checkpoints.

    Core cannot name a backend's types, so the fields that may hold a framework's own
    object are unions ending in `object`: a type checker then makes an adapter narrow
    them (`isinstance`, `is_core_dataset`) before it uses them, as its `validate` does
    at run time.

    Attributes:
        model: a `ModelOp`, or a native model the adapter accepts as it is (e.g. a
            `LightningModule`).
        data: a core `Dataset` / `IterableDataset`, or a native loader the adapter
            accepts (a `DataLoader`, a `LightningDataModule`, a `tf.data.Dataset`, ...).
        validation: like `data`, or None.
        optimizer_config: the canonical optimizer dict (`resolve_optimizer_config`), or
            a native optimizer object the adapter validates.
        sharding: the adapter's sharding spec (e.g. Equinox `ShardingSpec`), or None.
        callbacks: objects implementing any subset of the `Callback` hooks (dispatch is
            by `getattr`).
        rollout: training through the rollout (`Rollout`), or None for one-step training.
        restore_best: the artifact holds the weights of the best checkpoint by
            `checkpoint.monitor` (`TrainingLoop(restore_best=True)`, or an
            `EarlyStopping(restore_best=True)` among the callbacks), not the last ones.
    """

    model: ModelOp | object
    data: Dataset | IterableDataset | object
    validation: Dataset | IterableDataset | object | None
    loss: Callable[..., Any]
    metrics: dict[str, Callable[..., Any]]
    optimizer_config: dict[str, Any] | object
    batch_size: int
    max_steps: int | None
    max_epochs: int | None
    total_steps: int | None
    steps_per_epoch: int | None
    callbacks: tuple[Callback | object, ...]
    writers: tuple[MetricWriter, ...]
    checkpoint: Checkpoint | None
    seed: int
    adapter: Adapter
    sharding: object | None = None
    validate_every_n_steps: int | None = None
    accumulate_grad_batches: int = 1
    on_nonfinite: NonFinitePolicy = NonFinitePolicy.STOP
    max_consecutive_skips: int | None = None
    log_every_n_steps: int = 50
    shuffle: bool = True
    drop_remainder: bool = True
    sweep_id: str | None = None
    normalizer: Normalizer | None = None
    progress: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    preemption_signals: tuple[str, ...] = DEFAULT_PREEMPTION_SIGNALS
    max_time: float | None = None
    log_grad_norm: bool = False
    rollout: Rollout | None = None
    #: the model input's layout (`ModelInputs`) when the data's windows carry history,
    #: forcings or static inputs; None for a model of the state alone
    inputs: Any = None
    restore_best: bool = False

    @property
    def backend(self) -> str:
        """The adapter's backend name."""
        return str(getattr(self.adapter, "name", type(self.adapter).__name__))

    def to_json(self) -> dict[str, Any]:
        """The JSON form of the plan (live objects described, not stored)."""
        model_config = (
            self.model.get_config()
            if hasattr(self.model, "get_config")
            else {"type": type(self.model).__name__}
        )
        optimizer = (
            dict(self.optimizer_config)
            if isinstance(self.optimizer_config, dict)
            else {"object": type(self.optimizer_config).__name__}
        )
        adapter_config = self.adapter.get_config() if hasattr(self.adapter, "get_config") else {}
        plan = {
            "backend": self.backend,
            "adapter": adapter_config,
            "model": model_config,
            "data": _describe_data(self.data),
            "validation": _describe_data(self.validation),
            "loss": _describe(self.loss),
            "metrics": {k: _describe(v) for k, v in self.metrics.items()},
            "optimizer": optimizer,
            "batch_size": self.batch_size,
            "max_steps": self.max_steps,
            "max_epochs": self.max_epochs,
            "total_steps": self.total_steps,
            "steps_per_epoch": self.steps_per_epoch,
            "callbacks": [type(cb).__name__ for cb in self.callbacks],
            "writers": [type(w).__name__ for w in self.writers],
            "checkpoint": None
            if self.checkpoint is None
            else {
                "directory": self.checkpoint.location,
                "every_n_steps": self.checkpoint.every_n_steps,
                "max_to_keep": self.checkpoint.max_to_keep,
                "keep_best": self.checkpoint.keep_best,
                "monitor": self.checkpoint.monitor,
                "mode": self.checkpoint.mode,
                "async_save": self.checkpoint.async_save,
                "resume": self.checkpoint.resume,
                "every_n_minutes": self.checkpoint.every_n_minutes,
            },
            "seed": self.seed,
            "sharding": None if self.sharding is None else repr(self.sharding),
            "validate_every_n_steps": self.validate_every_n_steps,
            "accumulate_grad_batches": self.accumulate_grad_batches,
            "on_nonfinite": str(self.on_nonfinite),
            "max_consecutive_skips": self.max_consecutive_skips,
            "shuffle": self.shuffle,
            "drop_remainder": self.drop_remainder,
            "sweep_id": self.sweep_id,
            "preemption_signals": list(self.preemption_signals),
            "max_time": self.max_time,
            "log_grad_norm": self.log_grad_norm,
            "rollout": None if self.rollout is None else self.rollout.to_json(),
            "restore_best": self.restore_best,
            **({} if self.inputs is None else {"inputs": self.inputs.to_json()}),
        }
        return json.loads(json.dumps(plan, default=repr))

    def resume_key(self) -> dict[str, Any]:
        """The plan fields that must match for a checkpoint to be resumed."""
        plan = self.to_json()
        key = {k: plan[k] for k in RESUME_KEY_FIELDS}
        if self.rollout is not None:  # memory settings do not change the math
            key["rollout"] = self.rollout.resume_json()
        return key
