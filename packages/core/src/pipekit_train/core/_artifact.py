"""`TrainingArtifact`: everything a finished run hands downstream."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from ._heads import head_for_loss, head_options_for_loss
from ._history import History

__all__ = ["TrainingArtifact"]


@dataclass
class TrainingArtifact:
    """The result of `TrainingLoop.run()`.

    Attributes:
        model: the trained model operator.
        history: every metric written during the run.
        final_metrics: the last value of each metric.
        best_metric: the best value of the monitored metric (`val_loss` by default), if any.
        best_step: the step at which `best_metric` was reached.
        checkpoint_dir: where checkpoints were written, if any.
        weights_sha256: SHA-256 of `model.serialize_weights()`.
        plan: the frozen JSON plan of the run.
        backend: `"equinox"`, `"lightning"`, `"keras"` or `"numpy"`.
        versions: library versions the run used.
        wall_time_s: wall time of `run()` in seconds.
        steps_per_s: optimizer steps per second during this run.
        steps: total optimizer steps completed.
        resumed_from_step: the checkpoint step this run resumed from, if it resumed.
        stop_reason: why training stopped (`"max_steps"`, or a callback's reason).
        sweep_id: the sweep this run belongs to, if any.
        registry_uri: set by `register()`.
        normalizer: a normalizer that travels with the model to the registry, if any.
    """

    model: Any
    history: History
    final_metrics: dict[str, float]
    best_metric: float | None
    best_step: int | None
    checkpoint_dir: str | None
    weights_sha256: str
    plan: dict[str, Any]
    backend: str
    versions: dict[str, str]
    wall_time_s: float
    steps_per_s: float
    steps: int
    resumed_from_step: int | None = None
    stop_reason: str = "max_steps"
    sweep_id: str | None = None
    registry_uri: str | None = None
    normalizer: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def hash_weights(model: Any) -> str:
        """SHA-256 of a model operator's weight bytes."""
        return hashlib.sha256(model.serialize_weights()).hexdigest()

    def lineage(self) -> dict[str, Any]:
        """The lineage recorded with the model in a registry."""
        return {
            "plan": self.plan,
            "backend": self.backend,
            "versions": self.versions,
            "sweep_id": self.sweep_id,
            "steps": self.steps,
            "best_metric": self.best_metric,
            "best_step": self.best_step,
            "weights_sha256": self.weights_sha256,
            "wall_time_s": self.wall_time_s,
        }

    def register(
        self,
        registry: Any,
        name: str,
        *,
        normalizer: Any = None,
        head: str | None = None,
        head_options: dict[str, Any] | None = None,
    ) -> Any:
        """Hand the trained model to a `ModelRegistry` and return its `ModelRecord`.

        Args:
            registry: a `ModelRegistry` (e.g. `LocalModelRegistry(root)`).
            name: the model name in the registry.
            normalizer: a `Normalizer` to store with the model (default: the run's).
            head: what the model's output means (`"gaussian"`, `"mixture"` or
                `"point"`). Default: `"gaussian"` when the run's loss was `gaussian_nll`,
                `"mixture"` when it was `mixture_nll`, else not recorded.
            head_options: the head's options (`{"n_components": K, "covariance": ...}`
                for a mixture). Default: `mixture_nll`'s parameters when the run's loss
                was `mixture_nll` and the head is `"mixture"`.
        """
        norm = normalizer if normalizer is not None else self.normalizer
        loss = self.plan.get("loss")
        if head is None:
            head = head_for_loss(loss)
        if head_options is None and head is not None and head == head_for_loss(loss):
            head_options = head_options_for_loss(loss)
        extra: dict[str, Any] = {} if head is None else {"head": head}
        if head_options is not None:
            extra["head_options"] = head_options
        record = registry.register(
            name,
            self.model,
            metrics=self.final_metrics,
            lineage=self.lineage(),
            normalizer=norm.to_json() if norm is not None and hasattr(norm, "to_json") else norm,
            **extra,
        )
        self.registry_uri = getattr(record, "uri", None)
        return record

    def summary(self) -> str:
        """A one-paragraph human summary."""
        metrics = ", ".join(f"{k}={v:.4g}" for k, v in sorted(self.final_metrics.items()))
        return (
            f"{self.backend}: {self.steps} steps in {self.wall_time_s:.1f}s "
            f"({self.steps_per_s:.1f} steps/s); {metrics}; weights sha256 {self.weights_sha256[:12]}"
        )
