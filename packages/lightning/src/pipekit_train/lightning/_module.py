"""`PlanModule`: the generic `LightningModule` built from a plan (imports lightning)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import lightning as L

from ._data import unpack

__all__ = ["PlanModule"]


class PlanModule(L.LightningModule):
    """Wraps a `torch.nn.Module` with the plan's loss and optimizer.

    `training_step` returns the loss of `model(x)` against `y`; `configure_optimizers`
    builds the optimizer (and step-interval scheduler) from the plan. Nothing is logged
    per step: metrics go through core's `RunContext`.

    The run bridge's hooks are called from this module's own hooks (`on_train_start`,
    `on_train_batch_end`, `on_before_optimizer_step`) instead of registering the bridge as a
    Lightning `Callback`: Lightning dispatches every per-step hook to every callback
    (≈5 µs per callback and hook, ~7 hooks per step), while module hooks are called
    anyway.

    With `skip_nonfinite` (`TrainingLoop(on_nonfinite="skip")`) an update whose loss (with
    accumulation: the loss of any of its batches) is not finite is dropped: in
    `on_before_optimizer_step` (after backward, before clipping and the step) the
    gradients are set to None, so the torch optimizer leaves those parameters and their
    state (moments, step count) alone, and the step-interval schedule is not advanced
    (`lr_scheduler_step`); floating buffers (BatchNorm statistics) updated by a
    non-finite batch's forward are restored after its backward. Lightning still counts the step. Reading the flag costs
    one host sync per update, only under this policy.

    Args:
        model: the network.
        loss: `loss(pred, target) -> scalar tensor` (core array-API losses work on torch).
        build_optimizer: `params -> (optimizer, scheduler or None)`.
        bridge: the run bridge (`LightningHooks`) whose hooks this module forwards.
        skip_nonfinite: drop updates with a non-finite loss (see above).
        rollout: a `RolloutLoss` (rollout training): `training_step` minimises the
            rollout loss of the batch at the run's current update (`bridge.run.step`,
            which counts the run's updates across a resume), with the feed's noise.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        loss: Callable[[Any, Any], Any],
        build_optimizer: Callable[[Any], tuple[Any, Any]],
        bridge: Any = None,
        skip_nonfinite: bool = False,
        rollout: Any = None,
    ):
        super().__init__()
        self._rollout = rollout
        self.model = model
        self._loss = loss
        self._build_optimizer = build_optimizer
        self._bridge = bridge
        self._skip_nonfinite = bool(skip_nonfinite)
        self._update_finite: Any = None  # a device bool: every loss of this update finite
        self.skipped_update = False  # the latest update was dropped (read by the bridge)
        self._restore: Any = None  # (buffers, values before the forward, loss finite)

    def on_train_start(self) -> None:
        """Forward to the bridge (pending state, RNG, `on_train_start` callbacks)."""
        if self._bridge is not None:
            self._bridge.on_train_start(self.trainer, self)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Forward to the bridge (record, validate, checkpoint, stop)."""
        if self._bridge is not None:
            self._bridge.on_train_batch_end(self.trainer, self, outputs, batch, batch_idx)

    def forward(self, x: Any) -> Any:
        """The wrapped model's forward."""
        return self.model(x)

    def _update(self) -> int:
        """The run's current optimizer update (0-based; 0 without a bridge)."""
        run = getattr(self._bridge, "run", None)
        return 0 if run is None else int(run.step)

    def _batch_loss(self, batch: Any) -> Any:
        if self._rollout is not None:
            return self._rollout.train_loss(self.model, batch, self._update())
        x, y = (batch["x"], batch["y"]) if isinstance(batch, dict) else unpack(batch)
        return self._loss(self.model(x), y)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        """The plan's loss on one (micro-)batch (the rollout loss with `rollout`)."""
        if not self._skip_nonfinite:
            return self._batch_loss(batch)
        # floating buffers (BatchNorm statistics) are not updated from a non-finite batch
        buffers = [b for b in self.model.buffers() if b.is_floating_point()]
        with torch.no_grad():
            saved = [b.clone() for b in buffers]
        loss = self._batch_loss(batch)
        finite = torch.isfinite(loss.detach())
        if buffers:  # restored after backward, which may still read them
            self._restore = (buffers, saved, finite)
        seen = self._update_finite
        self._update_finite = finite if seen is None else seen & finite
        return loss

    def on_after_backward(self) -> None:
        """Under `skip_nonfinite`: undo a non-finite batch's update of the floating buffers."""
        restore, self._restore = self._restore, None
        if restore is not None:
            buffers, saved, finite = restore
            with torch.no_grad():
                for buffer, before in zip(buffers, saved, strict=True):
                    buffer.copy_(torch.where(finite, buffer, before))

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        """Under `skip_nonfinite`: drop the update (gradients to None) if a loss was not finite.

        The bridge reads the gradient norm first (`log_grad_norm`)."""
        if self._bridge is not None:
            self._bridge.on_before_optimizer_step(self.trainer, self, optimizer)
        if not self._skip_nonfinite:
            return
        finite, self._update_finite = self._update_finite, None
        skip = finite is not None and not bool(finite)
        if self.trainer.world_size > 1:  # every process skips the same updates
            skip = bool(self.trainer.strategy.reduce_boolean_decision(skip, all=False))
        self.skipped_update = skip
        if skip:
            for group in optimizer.param_groups:
                for param in group["params"]:
                    param.grad = None

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        """Step the schedule, except after a skipped update (it follows applied updates)."""
        if self.skipped_update:
            return
        super().lr_scheduler_step(scheduler, metric)

    def configure_optimizers(self) -> Any:
        """The plan's optimizer, and its schedule stepped every optimizer step."""
        optimizer, scheduler = self._build_optimizer(self.model.parameters())
        if scheduler is None:
            return optimizer
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1},
        }
