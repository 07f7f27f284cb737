"""`OnlineTrainer`: one gradient step per call, on whatever batch arrives."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ._checkpoint import Checkpoint
from ._errors import CheckpointError, ConfigError
from ._loop import _is_int, _resolve_loss, resolve_optimizer_config
from ._plan import Plan

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
            restored at construction, and a checkpoint is saved every `every_n_steps` calls.
        adapter: the backend adapter (default: the model's).
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
    ):
        if not _is_int(seed) or seed < 0:
            raise ConfigError(f"`seed` must be a non-negative int. Received: seed={seed!r}.")
        if adapter is None:
            default = getattr(model, "default_adapter", None)
            if not callable(default):
                raise ConfigError(
                    f"`model` must be a model operator. Received: model={type(model).__name__}."
                )
            adapter = default()
        if not callable(getattr(adapter, "step_backend", None)):
            raise ConfigError(
                f"The {getattr(adapter, 'name', adapter)!r} adapter has no online step backend."
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
            callbacks=(),
            writers=(),
            checkpoint=checkpoint,
            seed=int(seed),
            adapter=adapter,
            progress=False,
        )
        validate = getattr(adapter, "validate_online", None)
        if callable(validate):
            validate(self.plan)
        self._backend = adapter.step_backend(self.plan)
        self._state = self._backend.init_state()
        self.step = 0
        self._ckpt = self._backend.checkpointer() if checkpoint is not None else None
        if self._ckpt is not None and checkpoint is not None and checkpoint.resume != "never":
            restored = self._ckpt.restore_latest(self._state)
            if restored is not None:
                self._state, self.step = (
                    restored.state,
                    int(restored.meta.get("step", restored.step)),
                )
            elif checkpoint.resume == "must":
                raise CheckpointError(
                    f"`resume='must'` but {checkpoint.path} holds no complete checkpoint."
                )
        self.last_metrics: dict[str, float] = {}

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
        self.step += 1
        fetch = getattr(self._backend, "fetch", None) or (lambda vs: [np.asarray(v) for v in vs])
        names = list(metrics)
        self.last_metrics = {
            n: float(np.asarray(v))
            for n, v in zip(names, fetch([metrics[n] for n in names]), strict=False)
        }
        if (
            self._ckpt is not None
            and self.plan.checkpoint is not None
            and self.step % self.plan.checkpoint.every_n_steps == 0
        ):
            self.save()
        return np.asarray(pred)

    def run(self, batches: Any) -> list[np.ndarray]:
        """Feed an iterable of batches; return the predictions made for each."""
        return [self(b) for b in batches]

    @property
    def model(self) -> Any:
        """The current model operator."""
        return self._backend.model_op(self._state)

    def save(self) -> str:
        """Checkpoint the current state now."""
        if self._ckpt is None:
            raise ConfigError("OnlineTrainer.save() needs `checkpoint=Checkpoint(...)`.")
        path = self._ckpt.save(
            self.step,
            self._state,
            {"step": self.step, "resume_key": self.plan.resume_key()},
            self.last_metrics,
        )
        self._ckpt.wait()
        return path

    def close(self) -> None:
        """Wait for pending checkpoint writes."""
        if self._ckpt is not None:
            self._ckpt.close()

    def get_config(self) -> dict[str, Any]:
        """The JSON plan of the trainer."""
        return self.plan.to_json()
