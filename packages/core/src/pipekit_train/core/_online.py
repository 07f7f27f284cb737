"""`OnlineTrainer`: one gradient step per call, on whatever batch arrives."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ._adapter import Adapter
from ._checkpoint import Checkpoint
from ._errors import ConfigError
from ._lifecycle import RunLifecycle
from ._loop import _check_callbacks, _is_int, _resolve_loss
from ._lr_scale import adjusts_learning_rate
from ._plan import Plan
from ._policies import NonFinitePolicy
from ._preemption import DEFAULT_PREEMPTION_SIGNALS, resolve_signals
from ._spec import resolve_optimizer_config

__all__ = ["OnlineTrainer"]


class OnlineTrainer:
    """A stateful operator that trains online: each call takes one gradient step.

    `trainer({"x": x, "y": y})` returns the model's predictions for `x` (made before the
    update, i.e. honest one-step-ahead predictions) and then applies one optimizer step
    on the batch. The state (model, optimizer state, RNG, step) checkpoints like a
    training loop's, through the backend's checkpoint engine.

    Args:
        model: a model operator; its adapter provides the step function.
        loss: a loss name or callable.
        optimizer_config: as for `TrainingLoop`.
        seed: the seed of the backend RNG streams.
        checkpoint: a `Checkpoint` policy; with `resume="auto"` the latest state is
            restored at construction, and checkpoints follow the same cadence as a
            `TrainingLoop`'s (`every_n_steps`, `every_n_minutes`), each recorded in
            the checkpoint history.
        adapter: the backend adapter (default: the model's).
        callbacks: as for `TrainingLoop` (`on_step_end` after each call, `on_checkpoint`
            for each checkpoint).
        preemption_signals: as for `TrainingLoop`: from construction until `close()`,
            such a signal makes the next call checkpoint its step, restore the previous
            handlers and raise `Preempted`.
    """

    def __init__(
        self,
        model: Any,
        *,
        loss: Any = "mse",
        optimizer_config: Any = None,
        seed: int = 0,
        checkpoint: Checkpoint | None = None,
        adapter: Any = None,
        callbacks: Sequence[Any] | None = None,
        preemption_signals: Sequence[Any] | None = DEFAULT_PREEMPTION_SIGNALS,
    ):
        signals = resolve_signals(preemption_signals)
        if not _is_int(seed) or seed < 0:
            raise ConfigError(f"`seed` must be a non-negative int. Received: seed={seed!r}.")
        if adapter is None:
            default = getattr(model, "default_adapter", None)
            if not callable(default):
                raise ConfigError(
                    f"`model` must be a model operator. Received: model={type(model).__name__}."
                )
            adapter = default()
        if not isinstance(adapter, Adapter):
            raise ConfigError(
                "`adapter` must be a backend adapter (a `pipekit_train.core.adapter.Adapter`). "
                f"Received: adapter={adapter!r}."
            )
        if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
            raise ConfigError(
                f"`checkpoint` must be a Checkpoint. Received: checkpoint={checkpoint!r}."
            )
        self.plan = Plan(
            model=model,
            data=None,
            validation=None,
            loss=_resolve_loss(loss),
            metrics={},
            optimizer_config=resolve_optimizer_config(optimizer_config),
            batch_size=1,
            max_steps=None,
            max_epochs=None,
            total_steps=None,
            steps_per_epoch=None,
            callbacks=_check_callbacks(callbacks),
            writers=(),
            checkpoint=checkpoint,
            seed=int(seed),
            adapter=adapter,
            progress=False,
            on_nonfinite=NonFinitePolicy.IGNORE,  # an online step reports its loss; it never stops
            preemption_signals=signals,
        )
        if adjusts_learning_rate(self.plan):
            names = [type(cb).__name__ for cb in self.plan.callbacks]
            raise ConfigError(
                "OnlineTrainer runs no validation, so a callback that changes the learning rate "
                f"on a plateau never acts. Received: callbacks={names}. Drop it, or train "
                "with a TrainingLoop and validation data."
            )
        adapter.validate_online(self.plan)
        self._backend = adapter.step_backend(self.plan)
        self._run = RunLifecycle(
            self.plan,
            checkpointer=self._backend.checkpointer() if checkpoint is not None else None,
            fetch=self._backend.fetch,
        )
        self._ctx = self._run.ctx
        # the one resume path: resume policy, resume-key check, run state
        self._state, _ = self._run.restore(self._backend.init_state())
        # each checkpoint is durable when the call returns (an online run has no end)
        self._run.bind(save=self.save if checkpoint is not None else None, validate=lambda: None)
        self._run.begin()
        self.last_metrics: dict[str, float] = {}

    @property
    def step(self) -> int:
        """Optimizer steps taken (including those restored from a checkpoint)."""
        return self._ctx.step

    def __call__(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """Predict on `batch["x"]`, then take one optimizer step on `(x, y)`."""
        if not isinstance(batch, Mapping) or "x" not in batch or "y" not in batch:
            raise ConfigError(
                "OnlineTrainer expects a batch dict with 'x' and 'y'. "
                f"Received: {sorted(batch) if isinstance(batch, Mapping) else type(batch).__name__}."
            )
        host = {k: np.asarray(v) for k, v in batch.items()}
        pred, _ = self._backend.eval_batch(self._state, host)
        self._state, metrics = self._backend.train_step(self._state, self._backend.put(host))
        names = list(metrics)
        host_metrics = self._backend.fetch([metrics[n] for n in names])
        self.last_metrics = {
            n: float(np.asarray(v)) for n, v in zip(names, host_metrics, strict=True)
        }
        # the shared per-update sequence: cadence, signals, recorded checkpoints
        self._run.end_of_update(self.last_metrics)
        if self._run.preempted:
            self._run.settle()
        return np.asarray(pred)

    def run(self, batches: Any) -> list[np.ndarray]:
        """Feed an iterable of batches; return the predictions made for each."""
        return [self(b) for b in batches]

    @property
    def model(self) -> Any:
        """The current model operator."""
        return self._backend.model_op(self._state)

    def _save(self) -> str:
        assert self._run.checkpointer is not None
        ctx = self._ctx
        path = self._run.checkpointer.save(
            ctx.step, self._state, ctx.checkpoint_meta(), ctx.checkpoint_metrics()
        )
        ctx.record_checkpoint(path)
        return path

    def save(self) -> str:
        """Checkpoint the current state now (and wait until it is durable)."""
        if self._run.checkpointer is None:
            raise ConfigError("OnlineTrainer.save() needs `checkpoint=Checkpoint(...)`.")
        path = self._save()
        self._run.checkpointer.wait()
        return path

    def close(self) -> None:
        """Wait for pending checkpoint writes and restore the signal handlers."""
        self._run.close()

    def get_config(self) -> dict[str, Any]:
        """The JSON plan of the trainer."""
        return self.plan.to_json()
