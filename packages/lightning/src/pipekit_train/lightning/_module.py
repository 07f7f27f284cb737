"""`PlanModule`: the generic `LightningModule` built from a plan (imports lightning)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

import lightning as L

__all__ = ["PlanModule", "unpack"]


def unpack(batch: Any) -> tuple[Any, Any]:
    """`(x, y)` of a batch: a dict with `"x"`/`"y"` (core) or a pair (torch loaders)."""
    if isinstance(batch, Mapping):
        return batch["x"], batch["y"]
    if isinstance(batch, Sequence) and len(batch) >= 2:
        return batch[0], batch[1]
    raise TypeError(
        "A training batch must be a dict with 'x' and 'y' or an (x, y) pair. "
        f"Received: {type(batch).__name__}."
    )


class PlanModule(L.LightningModule):
    """Wraps a `torch.nn.Module` with the plan's loss and optimizer.

    `training_step` returns the loss of `model(x)` against `y`; `configure_optimizers`
    builds the optimizer (and step-interval scheduler) from the plan. Nothing is logged
    per step: metrics go through core's `RunContext`.

    The run bridge's hooks are called from this module's own hooks (`setup`,
    `on_train_start`, `on_train_batch_end`) instead of registering the bridge as a
    Lightning `Callback`: Lightning dispatches every per-step hook to every callback
    (≈5 µs per callback and hook, ~7 hooks per step), while module hooks are called
    anyway.

    Args:
        model: the network.
        loss: `loss(pred, target) -> scalar tensor` (core array-API losses work on torch).
        build_optimizer: `params -> (optimizer, scheduler or None)`.
        bridge: the run bridge (`RunBridge`) whose hooks this module forwards.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        loss: Callable[[Any, Any], Any],
        build_optimizer: Callable[[Any], tuple[Any, Any]],
        bridge: Any = None,
    ):
        super().__init__()
        self.model = model
        self._loss = loss
        self._build_optimizer = build_optimizer
        self._bridge = bridge

    def setup(self, stage: str) -> None:
        """Forward to the bridge (context, resume, data position)."""
        if self._bridge is not None:
            self._bridge.setup(self.trainer, self, stage)

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

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        """The plan's loss on one (micro-)batch."""
        if isinstance(batch, dict):
            return self._loss(self.model(batch["x"]), batch["y"])
        x, y = unpack(batch)
        return self._loss(self.model(x), y)

    def configure_optimizers(self) -> Any:
        """The plan's optimizer, and its schedule stepped every optimizer step."""
        optimizer, scheduler = self._build_optimizer(self.model.parameters())
        if scheduler is None:
            return optimizer
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1},
        }
