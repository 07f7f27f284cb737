"""Validation of a run: its schedule, core batching of the validation data, the best metric."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ._plan import Plan

__all__ = ["Validation"]


class Validation:
    """The validation half of `RunContext` (a mixin; the context holds the state)."""

    _plan: Plan
    step: int
    _steps_per_epoch: int | None
    _best_metric: float | None
    _best_step: int | None
    _monitor: str
    _mode: str

    if TYPE_CHECKING:  # provided by RunContext

        @property
        def _done(self) -> bool: ...

        def flush_metrics(self) -> None: ...

        def _write(self, step: int, metrics: Mapping[str, float]) -> None: ...

        def _dispatch(self, hook: str, *args: Any) -> None: ...

    def _due_validation(self, *, at_end: bool = True) -> bool:
        """Whether validation is due after the current step.

        Args:
            at_end: also validate when the run is done off the schedule (False for a
                preemption: the grace period goes to the checkpoint).
        """
        if self._plan.validation is None or self.step == 0:
            return False
        every = self._plan.validate_every_n_steps or self._steps_per_epoch
        if every and self.step % every == 0:
            return True
        return at_end and self._done

    def validate(
        self,
        eval_batch: Callable[[dict[str, np.ndarray]], tuple[Any, Any]],
        *,
        batches: Iterable[Mapping[str, np.ndarray]] | None = None,
    ) -> dict[str, float]:
        """Run validation with `eval_batch(batch) -> (pred, mean_loss)` and record it.

        Predictions come back to the host; the loss is averaged weighted by batch size and
        every metric is computed once on the concatenated predictions (numpy).

        Args:
            eval_batch: evaluates one numpy batch with the current weights.
            batches: one pass over the validation batches (a native loader's); None:
                core batches `plan.validation`.
        """
        if batches is None:
            from .data import make_batches

            it: Iterable[Any] = make_batches(
                self._plan.validation,
                self._plan.batch_size,
                seed=self._plan.seed,
                shuffle=False,
                drop_remainder=False,
                num_epochs=1,
            )
        else:
            it = batches
        from ._evaluation import aggregate_batches

        metrics = aggregate_batches(
            it, eval_batch, self._plan.metrics, normalizer=self._plan.normalizer
        )
        return self.record_validation(metrics)

    def record_validation(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """Record validation metrics (names get a `val_` prefix) and dispatch the hook."""
        self.flush_metrics()
        row = {(k if k.startswith("val_") else f"val_{k}"): float(v) for k, v in metrics.items()}
        self._write(self.step, row)
        value = row.get(self._monitor)
        if value is not None and math.isfinite(value):
            better = self._best_metric is None or (
                value < self._best_metric if self._mode == "min" else value > self._best_metric
            )
            if better:
                self._best_metric, self._best_step = value, self.step
        self._dispatch("on_validation_end")
        return row
