"""`Progress`: where a run stands — steps, epoch, the total, a stop request."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipekit_train.core.spec._plan import Plan

__all__ = ["Progress"]


class Progress:
    """The counters every part of a run reads.

    Attributes:
        step: optimizer steps completed (restored ones included).
        epoch: the current epoch (0-based; from `step` when the epoch length is known,
            else as the backend reports it).
        total_steps: the steps the run trains in all, when known.
        steps_per_epoch: optimizer steps per epoch of a sized dataset, else None.
        stop_reason: why the run was asked to stop, or None.
        resumed_from_step: the step a resume started at, or None.
    """

    def __init__(self, plan: Plan):
        self.step = 0
        self.epoch = 0
        self.total_steps: int | None = plan.total_steps
        self.steps_per_epoch: int | None = plan.steps_per_epoch
        self.stop_reason: str | None = None
        self.resumed_from_step: int | None = None

    @property
    def done(self) -> bool:
        """Whether training should stop now (total steps reached or a stop requested)."""
        total = self.total_steps
        return self.stop_reason is not None or (total is not None and self.step >= total)

    def advance(self, count: int = 1) -> None:
        """`count` optimizer steps finished."""
        self.step += count
        self._sync_epoch()

    def resume_at(self, step: int) -> None:
        """A checkpoint of `step` was restored."""
        self.step = int(step)
        self.resumed_from_step = self.step
        self._sync_epoch()

    def request_stop(self, reason: str) -> None:
        """Ask the run to stop after the current step (the first reason is kept)."""
        if self.stop_reason is None:
            self.stop_reason = str(reason)

    def _sync_epoch(self) -> None:
        spe = self.steps_per_epoch
        if spe:
            self.epoch = self.step // spe
