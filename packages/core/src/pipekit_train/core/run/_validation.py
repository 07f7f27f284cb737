"""Validation of a run: its schedule, core batching of the validation data, the best metric."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ._rollout_noise import plan_members, with_validation_members

if TYPE_CHECKING:
    from pipekit_train.core.spec._plan import Plan

    from ._dispatch import Callbacks
    from ._metrics import MetricLog
    from ._progress import Progress

__all__ = ["Validation"]


class Validation:
    """When validation is due, how it runs, and the best monitored value so far.

    Args:
        plan: the frozen plan (validation data, schedule, metrics, normalizer, monitor).
        progress: the run's counters.
        metrics: the run's metric log (validation rows are written there).
        callbacks: `on_validation_end` is dispatched after each validation.

    Attributes:
        best_metric: the best value of the monitored metric so far, or None.
        best_step: the step it was reached at, or None.
        monitor: the monitored metric (`Checkpoint.monitor`, default `val_loss`).
        mode: `"min"` or `"max"`.
    """

    def __init__(self, plan: Plan, progress: Progress, metrics: MetricLog, callbacks: Callbacks):
        self._plan = plan
        self._progress = progress
        self._metrics = metrics
        self._callbacks = callbacks
        self.best_metric: float | None = None
        self.best_step: int | None = None
        self.monitor = plan.checkpoint.monitor if plan.checkpoint else "val_loss"
        self.mode = plan.checkpoint.mode if plan.checkpoint else "min"

    @property
    def every(self) -> int | None:
        """Validate every this many steps (the schedule, else once per epoch), or None."""
        return self._plan.validate_every_n_steps or self._progress.steps_per_epoch

    def due(self, *, at_end: bool = True) -> bool:
        """Whether validation is due after the current step.

        Args:
            at_end: also validate when the run is done off the schedule (False for a
                preemption: the grace period goes to the checkpoint).
        """
        step = self._progress.step
        if self._plan.validation is None or step == 0:
            return False
        every = self.every
        if every and step % every == 0:
            return True
        return at_end and self._progress.done

    def run(
        self,
        eval_batch: Callable[[dict[str, np.ndarray]], tuple[Any, Any]],
        *,
        batches: Iterable[Mapping[str, np.ndarray]] | None = None,
    ) -> dict[str, float]:
        """Run validation with `eval_batch(batch) -> (pred, mean_loss)` and record it.

        Predictions come back to the host; the loss is averaged weighted by batch size,
        every metric is computed once on the concatenated predictions (numpy), and the
        plan's normalizer applies to every batch.

        Args:
            eval_batch: evaluates one numpy batch with the current weights.
            batches: one pass over the validation batches (a native loader's, as numpy
                batch dicts); None: core batches `plan.validation`.
        """
        plan = self._plan
        if batches is None:
            from pipekit_train.core.data import make_batches

            it: Iterable[Any] = make_batches(
                plan.validation,
                plan.batch_size,
                seed=plan.seed,
                shuffle=False,
                drop_remainder=False,
                num_epochs=1,
            )
        else:
            it = batches
        members = plan_members(plan)
        if members is not None:  # a generative model: the same members at every validation
            it = with_validation_members(it, seed=plan.seed, members=members)
        from pipekit_train.core.artifact._evaluation import aggregate_batches

        metrics = aggregate_batches(it, eval_batch, plan.metrics, normalizer=plan.normalizer)
        return self.record(metrics)

    def record(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """Record validation metrics (names get a `val_` prefix) and dispatch the hook."""
        log = self._metrics
        log.flush()
        # callbacks that measure the model at validation (a rollout) join the row, so the
        # monitored metric of best-k checkpoints, EarlyStopping and ReduceLROnPlateau may
        # be theirs
        merged = {**metrics, **self._callbacks.validation_metrics()}
        row = {(k if k.startswith("val_") else f"val_{k}"): float(v) for k, v in merged.items()}
        log.write(self._progress.step, row)
        value = row.get(self.monitor)
        if value is not None and math.isfinite(value):
            better = self.best_metric is None or (
                value < self.best_metric if self.mode == "min" else value > self.best_metric
            )
            if better:
                self.best_metric, self.best_step = value, self._progress.step
        self._callbacks.dispatch("on_validation_end")
        return row
