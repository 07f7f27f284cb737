"""`TrainingLoop`: validate a training description up front, freeze it, run it."""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence
from typing import Any

from pipekit_train.core.artifact._artifact import TrainingArtifact
from pipekit_train.core.checkpoint._policy import Checkpoint
from pipekit_train.core.spec._policies import NonFinitePolicy
from pipekit_train.core.spec._rollout import Rollout
from pipekit_train.core.spec._signals import DEFAULT_PREEMPTION_SIGNALS

from ._build_plan import build_plan, check_plan
from ._shapes import check_shapes

__all__ = ["TrainingLoop"]


class TrainingLoop:
    """One training description that runs on any backend.

    Everything is validated at construction (nothing touches disk until `run()`), then
    frozen into a `Plan`. The adapter defaults to the model operator's own
    (`EquinoxModelOp` → `Equinox()`, `LightningModelOp` → `Lightning()`, ...).

    Args:
        model: a model operator (`EquinoxModelOp`, `LightningModelOp`, `KerasModelOp`)
            or a backend-native model the chosen adapter accepts.
        data: the training dataset (samples `{"x": ..., "y": ...}`; rename other keys
            with `as_supervised(data, input=..., target=...)`) or a native loader.
        validation: an optional validation dataset.
        loss: a loss name (`"mse"`), a `Loss`, or a callable `loss(pred, target)`.
        metrics: validation metric names or callables.
        optimizer_config: `{"name": "adam", "lr": 1e-3, ...}` (`lr` and `learning_rate`
            both accepted; schedules as `{"schedule": "cosine", ...}`), or a
            backend-native optimizer.
        batch_size: samples per batch (per optimizer step, unless accumulating).
        max_steps: stop after this many optimizer steps.
        max_epochs: stop after this many passes over the data (sized datasets).
        callbacks: objects implementing any of the `Callback` hooks.
        writers: metric writers.
        checkpoint: a `Checkpoint` policy (or a directory path for the defaults).
        seed: the seed of the data order and of the backend's RNG streams.
        adapter: the backend adapter; inferred from `model` when None.
        sharding: a backend-specific sharding spec (e.g. Equinox `ShardingSpec`).
        validate_every_n_steps: validation schedule (default: every epoch and at the end).
        log_every_n_steps: metrics are fetched from the device and written in groups of
            this many steps.
        accumulate_grad_batches: gradient accumulation: each optimizer update averages the
            gradients of this many consecutive batches of `batch_size`. Steps (`max_steps`,
            logging, validation and checkpoint cadence, schedules) count updates, and a
            step's `loss` is the mean over its batches, the same on every backend.
        on_nonfinite: what a non-finite training loss does. `"stop"` (the default) ends
            the run with `NonFiniteLossError` naming the first such step; no checkpoint is
            ever written from a state whose loss history contains it, so the last good
            checkpoint survives rotation and resumes exactly. `"skip"` drops the update of a
            step whose loss is not finite (parameters, optimizer state and layer state stay
            as they were; the batch is consumed and the step counted), records the running
            number of skipped steps as the metric `nonfinite_skipped` on each skipped step,
            and stops with `NonFiniteLossError` after `max_consecutive_skips` consecutive
            skips; a checkpoint due on a skipped step is postponed to the next step whose
            loss is finite. `"ignore"` trains on.
        max_consecutive_skips: with `on_nonfinite="skip"`, how many consecutive skipped
            steps end the run (default 10). Only valid with `"skip"`.
        shuffle: shuffle the training data each epoch.
        drop_remainder: drop the last partial batch of each epoch.
        sweep_id: set by sweeps; recorded on the artifact.
        normalizer: a fitted `Normalizer`: every training and validation batch passes
            through `normalizer.apply` (so validation metrics are in normalised units),
            and it travels with the trained model to the registry, where `NeuralForward`
            applies it around the model.
        progress: show a progress bar (default: only on a TTY).
        preemption_signals: the signals that preempt the run (default SIGTERM and
            SIGUSR1; names like `"SIGTERM"` or `signal.Signals`; `[]` disables). On one,
            the run finishes its current step (or fused group), checkpoints it, waits
            until every save is durable, restores the previous handlers and raises
            `Preempted`. SIGINT stays `KeyboardInterrupt`. See the checkpoints guide.
        max_time: a wall-clock budget for this run (seconds, a `datetime.timedelta` or
            `"DD:HH:MM:SS"`): when it is spent the run checkpoints and stops with
            `artifact.stop_reason == "max_time"`; a rerun resumes with a fresh budget.
        log_grad_norm: record the metric `grad_norm` every optimizer update: the global
            L2 norm of the gradient the update uses, before clipping (with accumulation:
            of the accumulated gradient). Off by default; the backend must support it.
        rollout: train through the rollout: a `Rollout` (steps, weights, backprop,
            noise, schedule, residual); `data` must then be `TrajectoryWindows` covering
            its longest length. Equinox, Lightning() and Torch() for now. None: one-step
            training.
        restore_best: end the run with the weights of its best checkpoint, not the last
            ones (as Keras's `restore_best_weights` and Lightning's `ckpt_path="best"`),
            on every backend. "Best" is by the checkpoint's `monitor` and `mode`, which
            must be a validation metric, and `checkpoint` must keep the best
            (`Checkpoint(keep_best=1, monitor="val_loss")`). The run saves a checkpoint
            at every validation that improves the metric (besides its schedule); at the
            end the checkpoint of the best step (`artifact.best_step`) is restored as a
            resume restores, so `artifact.model` holds its weights bit for bit, and
            `artifact.weights_step` names the step. A resumed run keeps the best step
            of the runs before it. `EarlyStopping(restore_best=True)` asks for the same.
    """

    def __init__(
        self,
        model: Any,
        data: Any,
        validation: Any = None,
        *,
        loss: Any = "mse",
        metrics: Any = None,
        optimizer_config: Any = None,
        batch_size: int = 32,
        max_steps: int | None = None,
        max_epochs: int | None = None,
        callbacks: Sequence[Any] | None = None,
        writers: Sequence[Any] | None = None,
        checkpoint: Checkpoint | str | os.PathLike[str] | None = None,
        seed: int = 0,
        adapter: Any = None,
        sharding: Any = None,
        validate_every_n_steps: int | None = None,
        log_every_n_steps: int = 50,
        accumulate_grad_batches: int = 1,
        on_nonfinite: NonFinitePolicy | str = "stop",
        max_consecutive_skips: int | None = None,
        shuffle: bool = True,
        drop_remainder: bool = True,
        sweep_id: str | None = None,
        normalizer: Any = None,
        progress: bool | None = None,
        preemption_signals: Sequence[Any] | None = DEFAULT_PREEMPTION_SIGNALS,
        max_time: float | str | datetime.timedelta | None = None,
        log_grad_norm: bool = False,
        rollout: Rollout | None = None,
        restore_best: bool = False,
    ):
        self.plan = build_plan(
            model,
            data,
            validation,
            loss=loss,
            metrics=metrics,
            optimizer_config=optimizer_config,
            batch_size=batch_size,
            max_steps=max_steps,
            max_epochs=max_epochs,
            callbacks=callbacks,
            writers=writers,
            checkpoint=checkpoint,
            seed=seed,
            adapter=adapter,
            sharding=sharding,
            validate_every_n_steps=validate_every_n_steps,
            log_every_n_steps=log_every_n_steps,
            accumulate_grad_batches=accumulate_grad_batches,
            on_nonfinite=on_nonfinite,
            max_consecutive_skips=max_consecutive_skips,
            shuffle=shuffle,
            drop_remainder=drop_remainder,
            sweep_id=sweep_id,
            normalizer=normalizer,
            progress=progress,
            preemption_signals=preemption_signals,
            max_time=max_time,
            log_grad_norm=log_grad_norm,
            rollout=rollout,
            restore_best=restore_best,
        )
        adapter = self.plan.adapter
        adapter.validate(self.plan)  # the backend's own checks first
        check_plan(adapter, self.plan)  # then what it declares it can do, and the monitors
        check_shapes(adapter, self.plan)  # probe the model with the data's shapes

    @property
    def adapter(self) -> Any:
        """The adapter that will run the plan."""
        return self.plan.adapter

    def get_config(self) -> dict[str, Any]:
        """The frozen JSON plan."""
        return self.plan.to_json()

    def run(self) -> TrainingArtifact:
        """Train (resuming from the latest complete checkpoint if any) and return the artifact."""
        return self.plan.adapter.run(self.plan)

    def __repr__(self) -> str:
        return f"TrainingLoop(backend={self.plan.backend!r}, total_steps={self.plan.total_steps})"
