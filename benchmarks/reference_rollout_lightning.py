"""A hand-written k-step rollout training of the Lorenz-96 emulator in PyTorch Lightning.

The Lightning twin of `reference_rollout_torch.py`: the same training as a Lightning user
writes it by hand, the reference that `bench_rollout_training.py`'s `lightning-trainer`
pair holds the library's `TrainingLoop(rollout=Rollout(steps=k, residual=True))` on the
`Lightning()` adapter against. No pipekit code. Everything but the loop is the plain-torch
reference's, imported from it: the windows, the per-variable statistics, the MLP (built
under `torch.manual_seed(seed)`: the same initial weights) and `rollout`. The loop is
Lightning's:

- **The module.** A `lightning.LightningModule` holding the MLP and the statistics; its
  `training_step` unrolls the `k` residual steps `next = x + model((x - mean_x) / std_x) *
  std_dx + mean_dx` from the window's first state and returns the mean of the `k`
  per-step mse losses (states normalised with the state statistics);
  `configure_optimizers` returns `torch.optim.Adam` at the constant learning rate.
- **The data.** A plain iterable of the batches (tensors `(batch, k + 1, d)`) in the
  plain-torch reference's order: a permutation of the windows per epoch from
  `np.random.default_rng(seed)`, cut into batches, the last partial batch dropped;
  `updates` batches in all, one Lightning epoch.
- **The run.** `lightning.Trainer(max_steps=updates, accelerator="cpu", devices=1,
  logger=False, enable_checkpointing=False, enable_progress_bar=False,
  enable_model_summary=False).fit(module, train_dataloaders=batches)`.

`train(...)` calls `on_update(i, loss)` after update `i` (1-based, from the module's
`on_train_batch_end`; on the CPU the update has finished by then); `rollout(...)` is the
plain-torch reference's. Thread settings (`torch.set_num_threads`) are the caller's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import lightning
import numpy as np
import torch
from reference_rollout_torch import Stats, _constants, fit_stats, make_mlp, rollout, windows

__all__ = ["RolloutModule", "rollout", "train"]


class RolloutModule(lightning.LightningModule):
    """The residual emulator trained through `k`-step rollouts of every window."""

    def __init__(
        self,
        model: torch.nn.Module,
        stats: Stats,
        k: int,
        lr: float,
        on_update: Callable[[int, torch.Tensor], None] | None = None,
    ):
        super().__init__()
        self.model = model
        self.mx, self.sx, self.mdx, self.sdx = _constants(stats)
        self.k, self.lr, self.on_update = k, lr, on_update

    def training_step(self, window: torch.Tensor, batch_idx: int) -> torch.Tensor:
        x = window[:, 0]
        total = torch.zeros(())
        for step in range(1, self.k + 1):
            x = x + self.model((x - self.mx) / self.sx) * self.sdx + self.mdx
            total = total + torch.mean(((x - window[:, step]) / self.sx) ** 2)
        return total / self.k

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.model.parameters(), lr=self.lr)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.on_update is not None:  # after the optimizer step: global_step counts it
            self.on_update(self.global_step, outputs["loss"].detach())


class _Batches:
    """The `updates` batches of windows in the plain-torch reference's order."""

    def __init__(self, data: np.ndarray, batch_size: int, updates: int, seed: int):
        self.data, self.batch_size, self.updates, self.seed = data, batch_size, updates, seed

    def __iter__(self) -> Iterator[torch.Tensor]:
        rng = np.random.default_rng(self.seed)
        per_epoch = len(self.data) // self.batch_size
        order = rng.permutation(len(self.data))
        for i in range(self.updates):
            j = i % per_epoch
            if i and j == 0:
                order = rng.permutation(len(self.data))
            yield torch.from_numpy(
                self.data[order[j * self.batch_size : (j + 1) * self.batch_size]]
            )


def train(
    trajectories: np.ndarray,
    *,
    k: int,
    updates: int,
    batch_size: int,
    lr: float,
    width: int,
    depth: int,
    seed: int,
    on_update: Callable[[int, torch.Tensor], None] | None = None,
) -> tuple[torch.nn.Sequential, Stats]:
    """Train a residual emulator through `k`-step rollouts for `updates` adam updates,
    with a Lightning `Trainer`.

    Args:
        trajectories: training trajectories `(n, T, d)`.
        k: the rollout length of every update.
        updates: the number of optimizer updates.
        batch_size: windows per update.
        lr: adam's learning rate (constant).
        width, depth: the MLP's hidden layers.
        seed: the seed of the initial weights and of the batch order.
        on_update: called with the update's number (1-based) and its loss (a detached
            tensor) after each update.

    Returns:
        The trained model and the statistics it is used with.
    """
    stats = fit_stats(trajectories)
    model = make_mlp(trajectories.shape[-1], width, depth, seed)
    module = RolloutModule(model, stats, k, lr, on_update)
    trainer = lightning.Trainer(
        max_steps=updates,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    batches = _Batches(windows(trajectories, k), batch_size, updates, seed)
    trainer.fit(module, train_dataloaders=batches)
    return model, stats
