"""The checkpoint schedule of a run: what is due, and what a checkpoint's meta holds."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipekit_train.core.spec._plan import Plan

    from ._metrics import MetricLog
    from ._progress import Progress
    from ._validation import Validation

__all__ = ["CheckpointSchedule"]


class CheckpointSchedule:
    """When the next checkpoint is due, and the JSON a checkpoint saves besides the state.

    Args:
        plan: the frozen plan (its `Checkpoint` policy).
        progress: the run's counters.
        metrics: the run's metric log (history, latest values, skipped steps).
        validation: the best monitored value so far.
        run_extras: `() -> dict` of further run state to save (callback states, the
            learning-rate scale).

    Attributes:
        last: the path of the latest checkpoint recorded, or None.
        owed: a checkpoint due on a skipped step was postponed to the next step.
    """

    def __init__(
        self,
        plan: Plan,
        progress: Progress,
        metrics: MetricLog,
        validation: Validation,
        run_extras: Callable[[], dict[str, Any]],
    ):
        self._plan = plan
        self._plan_json = plan.to_json()
        self._progress = progress
        self._metrics = metrics
        self._validation = validation
        self._run_extras = run_extras
        self.last: str | None = None
        self.owed = False

    def steps_until_event(self, limit: int) -> int:
        """How many steps may be fused before the next validation/checkpoint/end (≤ limit)."""
        progress = self._progress
        step = progress.step
        k = limit
        total = progress.total_steps
        if total is not None:
            k = min(k, total - step)
        ck = self._plan.checkpoint
        if ck is not None:
            k = min(k, ck.every_n_steps - step % ck.every_n_steps)
            if self.owed:  # postponed from a skipped step: retry after the next
                k = 1
        if self._plan.validation is not None:
            every = self._validation.every
            if every:
                k = min(k, every - step % every)
        return max(1, k)

    def due(self, *, best: bool = False) -> bool:
        """Whether a checkpoint is due after the current step.

        Args:
            best: the validation of this step improved the monitored metric and the plan
                restores the best checkpoint at the end (`restore_best`): save it now.
        """
        ck = self._plan.checkpoint
        if ck is None:
            return False
        step = self._progress.step
        due = ck.due(step, final=self._progress.done) or self.owed or best
        if not due or self._plan.on_nonfinite != "skip":
            return due
        # under "skip", never checkpoint right after a skipped step: postpone to the next
        # step whose loss is finite (so a run stopped by consecutive skips keeps the last
        # checkpoint from before them, and a resume never opens inside a run of skips)
        self._metrics.flush()
        self.owed = self._metrics.last_skipped == step
        return not self.owed

    def meta(self, data_state: Mapping[str, Any] | None) -> dict[str, Any]:
        """The JSON saved with every checkpoint: step, data position, run state, plan."""
        log, progress, validation = self._metrics, self._progress, self._validation
        log.flush()
        run: dict[str, Any] = {
            "step": progress.step,
            "history": log.history.to_json(),
            "best_metric": validation.best_metric,
            "best_step": validation.best_step,
            "latest": log.latest,
            **self._run_extras(),
        }
        return {
            "step": progress.step,
            "epoch": progress.epoch,
            "data_iter": None if data_state is None else dict(data_state),
            "run": run,
            "resume_key": self._plan.resume_key(),
            "plan": self._plan_json,
        }

    def metrics(self) -> dict[str, float]:
        """Host metrics for retention decisions (the monitored metric, when known)."""
        return dict(self._metrics.latest)
