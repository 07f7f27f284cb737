"""The checkpoint schedule of a run: what is due, what a checkpoint's meta holds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._history import History
    from ._plan import Plan

__all__ = ["CheckpointSchedule"]


class CheckpointSchedule:
    """The checkpoint half of `RunContext` (a mixin; the context holds the state)."""

    _plan: Plan
    _plan_json: dict[str, Any]
    step: int
    epoch: int
    total_steps: int | None
    _steps_per_epoch: int | None
    _history: History
    _best_metric: float | None
    _best_step: int | None
    _latest: dict[str, float]
    _train_iter: Any
    _last_checkpoint: str | None
    _checkpoint_owed: bool
    _last_skipped: int | None

    if TYPE_CHECKING:  # provided by RunContext

        @property
        def _done(self) -> bool: ...

        def flush_metrics(self) -> None: ...

        def _stateful(self) -> list[tuple[str, Any]]: ...

        def _dispatch(self, hook: str, *args: Any) -> None: ...

    def steps_until_event(self, limit: int) -> int:
        """How many steps may be fused before the next validation/checkpoint/end (≤ limit)."""
        k = limit
        total = self.total_steps
        if total is not None:
            k = min(k, total - self.step)
        ck = self._plan.checkpoint
        if ck is not None:
            k = min(k, ck.every_n_steps - self.step % ck.every_n_steps)
            if self._checkpoint_owed:  # postponed from a skipped step: retry after the next
                k = 1
        if self._plan.validation is not None:
            every = self._plan.validate_every_n_steps or self._steps_per_epoch
            if every:
                k = min(k, every - self.step % every)
        return max(1, k)

    def _due_checkpoint(self) -> bool:
        """Whether a checkpoint is due after the current step."""
        ck = self._plan.checkpoint
        if ck is None:
            return False
        due = ck.due(self.step, final=self._done) or self._checkpoint_owed
        if not due or self._plan.on_nonfinite != "skip":
            return due
        # under "skip", never checkpoint right after a skipped step: postpone to the next
        # step whose loss is finite (so a run stopped by consecutive skips keeps the last
        # checkpoint from before them, and a resume never opens inside a run of skips)
        self.flush_metrics()
        self._checkpoint_owed = self._last_skipped == self.step
        return not self._checkpoint_owed

    def checkpoint_meta(self, data_state: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The JSON saved with every checkpoint: step, data iterator state, run state, plan."""
        self.flush_metrics()
        get_state = getattr(self._train_iter, "get_state", None)
        if data_state is None and callable(get_state):
            data_state = get_state()
        run: dict[str, Any] = {
            "step": self.step,
            "history": self._history.to_json(),
            "best_metric": self._best_metric,
            "best_step": self._best_step,
            "latest": self._latest,
            "callbacks": {key: obj.state_dict() for key, obj in self._stateful()},
        }
        if getattr(self, "adjusts_lr", False):
            run["lr_scale"] = float(getattr(self, "_lr_scale", 1.0))
        return {
            "step": self.step,
            "epoch": self.epoch,
            "data_iter": None if data_state is None else dict(data_state),
            "run": run,
            "resume_key": self._plan.resume_key(),
            "plan": self._plan_json,
        }

    def checkpoint_metrics(self) -> dict[str, float]:
        """Host metrics for retention decisions (the monitored metric, when known)."""
        return dict(self._latest)

    def record_checkpoint(self, path: str) -> None:
        """A checkpoint was written (or scheduled, for async engines); dispatch the hook."""
        self._last_checkpoint = path
        self._dispatch("on_checkpoint", path)
