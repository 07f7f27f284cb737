"""`OnlineTrainer`: one gradient step per call, on whatever batch arrives."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.checkpoint._policy import Checkpoint
from pipekit_train.core.run._lifecycle import RunLifecycle
from pipekit_train.core.spec._signals import DEFAULT_PREEMPTION_SIGNALS

from ._build_plan import check_online, online_plan

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
        rollout: must be None: training through the rollout needs windows of
            consecutive states, and an online stream of `(x, y)` pairs has no
            trajectories to roll out through. A `Rollout` is refused before any work;
            train through the rollout with `TrainingLoop(data=TrajectoryWindows(...),
            rollout=...)`.
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
        rollout: Any = None,
    ):
        if rollout is not None:
            steps = getattr(rollout, "steps", None)
            received = f"Rollout(steps={steps})" if steps is not None else repr(rollout)
            raise ConfigError(
                "OnlineTrainer takes one optimizer step per call on the pairs it is given, "
                "and an online stream of (x, y) pairs has no trajectories to roll out "
                f"through. Received: rollout={received}. Train through the rollout with "
                "TrainingLoop(data=TrajectoryWindows(...), rollout=...), or drop `rollout`."
            )
        self.plan = online_plan(
            model,
            loss=loss,
            optimizer_config=optimizer_config,
            seed=seed,
            checkpoint=checkpoint,
            adapter=adapter,
            callbacks=callbacks,
            preemption_signals=preemption_signals,
        )
        adapter = self.plan.adapter
        check_online(adapter, self.plan)
        adapter.validate_online(self.plan)
        self._backend = adapter.step_backend(self.plan)
        self._run = RunLifecycle(
            self.plan,
            checkpointer=self._backend.checkpointer() if checkpoint is not None else None,
            fetch=self._backend.fetch,
            durable_saves=True,  # each checkpoint is durable when the call returns
            is_chief=bool(self._backend.is_chief),
            processes=int(self._backend.data_shard[1]),
        )
        try:
            # the one resume path: resume policy, resume-key check, run state
            self._state, _ = self._run.restore(self._backend.init_state())
            self._run.bind(state=lambda: self._state, agree=getattr(self._backend, "agree", None))
            self._run.begin()
        except BaseException:
            self._run.abort()  # releases the location's lease
            raise
        self.last_metrics: dict[str, float] = {}

    @property
    def step(self) -> int:
        """Optimizer steps taken (including those restored from a checkpoint)."""
        return self._run.step

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

    def save(self) -> str:
        """Checkpoint the current state now (and wait until it is durable)."""
        if self._run.checkpointer is None:
            raise ConfigError("OnlineTrainer.save() needs `checkpoint=Checkpoint(...)`.")
        return self._run.save()

    def close(self) -> None:
        """Wait for pending checkpoint writes and restore the signal handlers."""
        self._run.close()

    def get_config(self) -> dict[str, Any]:
        """The JSON plan of the trainer."""
        return self.plan.to_json()
