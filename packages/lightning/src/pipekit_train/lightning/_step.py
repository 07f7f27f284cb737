"""`TorchStepBackend`: plain-torch train/eval steps for core's `OnlineTrainer`.

One optimizer step per call, no Lightning involved. Dropout and other random layers
draw from a private torch CPU RNG state carried in the training state (the caller's
global RNG is left alone), so it checkpoints and resumes exactly with the model,
optimizer and schedule.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from pipekit_train.core.adapter import Plan, StepBackend

from ._checkpoint import TorchState, checkpointer, derive_seed, fetch
from ._losses import torch_loss
from ._model import LightningModelOp, as_input, module_dtype
from ._optim import build_optimizer, gradient_clip

__all__ = ["TorchStepBackend"]


class TorchStepBackend(StepBackend[TorchState]):
    """Core's `StepBackend` protocol in plain torch (see the module docs).

    Args:
        plan: the plan (`OnlineTrainer`'s or a `TrainingLoop`'s).
    """

    name = "lightning"

    def __init__(self, plan: Plan):
        self.plan = plan
        model = plan.model
        self._op = (
            model
            if isinstance(model, LightningModelOp)
            else LightningModelOp.wrap(model, seed=plan.seed)
        )
        self._loss = torch_loss(plan.loss)
        self._clip = gradient_clip(plan.optimizer_config)
        self._dtype, self._device = module_dtype(self._op.model)

    def init_state(self) -> TorchState:
        """A copy of the model, a fresh optimizer (and schedule) and a seeded private RNG."""
        net = copy.deepcopy(self._op.model)
        net.train()
        optimizer, scheduler = build_optimizer(
            self.plan.optimizer_config, net.parameters(), total_steps=self.plan.total_steps
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.plan.seed, 0, 1))
            rng = torch.get_rng_state()
        return TorchState(net, [optimizer], [] if scheduler is None else [scheduler], torch_rng=rng)

    def put(self, batch: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """Numpy batch → tensors on the model's device (floating arrays in its dtype)."""
        return {k: as_input(v, self._dtype, self._device) for k, v in batch.items()}

    def train_step(
        self, state: TorchState, batch: Mapping[str, Any]
    ) -> tuple[TorchState, dict[str, Any]]:
        """One optimizer step; the loss stays a tensor."""
        net, optimizer = state.module, state.optimizers[0]
        with torch.random.fork_rng(devices=[]):
            if state.torch_rng is not None:
                torch.set_rng_state(state.torch_rng)
            loss = self._loss(net(batch["x"]), batch["y"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if self._clip is not None:
                value, algorithm = self._clip
                if algorithm == "norm":
                    torch.nn.utils.clip_grad_norm_(net.parameters(), value)
                else:
                    torch.nn.utils.clip_grad_value_(net.parameters(), value)
            optimizer.step()
            for scheduler in state.schedulers:
                scheduler.step()
            state.torch_rng = torch.get_rng_state()
        return state, {"loss": loss.detach()}

    def eval_batch(
        self, state: TorchState, batch: Mapping[str, np.ndarray]
    ) -> tuple[np.ndarray, float]:
        """`(predictions, mean loss)` in eval mode without autograd."""
        net = state.module
        was = net.training
        net.eval()
        try:
            with torch.no_grad():
                inputs = self.put(batch)
                pred = net(inputs["x"])
                loss = float(self._loss(pred, inputs["y"]))
        finally:
            net.train(was)
        out = pred.detach()
        if out.dtype in (torch.bfloat16, torch.float16):
            out = out.float()
        return out.cpu().numpy(), loss

    def learning_rate(self, state: TorchState) -> float:
        """The first parameter group's learning rate."""
        return float(state.optimizers[0].param_groups[0]["lr"])

    def fetch(self, values: Any) -> list[np.ndarray]:
        """Tensors to host arrays in one transfer."""
        return fetch(values)

    def model_op(self, state: TorchState) -> LightningModelOp:
        """An independent operator holding a copy of the current module."""
        net = copy.deepcopy(state.module)
        net.eval()
        return self._op.with_model(net)

    def checkpointer(self) -> Any:
        """Core's atomic directory store with the torch encoding."""
        assert self.plan.checkpoint is not None
        return checkpointer(self.plan.checkpoint)
