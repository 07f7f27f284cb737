"""`LightningHooks`: drives core's `RunLifecycle` from Lightning's hooks (imports lightning).

Lightning owns the loop (`Trainer.fit`); core owns everything around it. `Lightning.run`
builds the `RunLifecycle` around the fit (`with RunLifecycle(...) as run:`) and hands it
to the bridge before the fit. The generated `PlanModule` calls the bridge from its own
hooks; for a user `LightningModule` the bridge is registered as a Lightning `Callback`
(its hook signatures are the callback ones either way). The bridge

- in `start` (before `Trainer.fit`, the rank and world size known from the `Trainer`):
  applies the resume policy (model weights now; optimizer, scheduler, RNG and
  grad-scaler state once Lightning has built them), opens the run's batch feed over
  core's batching (this rank's part of every global batch) or loads a native loader's
  saved position, binds the lifecycle's callables (the state to save, validation, the
  learning-rate scale, the cross-process agreement) and sets Lightning's `max_steps` to
  the steps left;
- in `on_train_start`: loads the pending optimizer/scheduler state, restores (or seeds)
  every RNG stream, and begins the run (`RunLifecycle.begin`: preemption handlers,
  clocks, `on_train_start`);
- in `on_train_batch_end`, once per *optimizer* step: `end_of_update` with the loss
  still on the device (the lifecycle records it, validates and checkpoints when due),
  and `trainer.should_stop` when the run is done.

A checkpoint is core's atomic `DirectoryCheckpointer` step folder: model, optimizer and
scheduler state (safetensors + JSON), every process's RNG states, the data position
after the last batch trained on (the lifecycle's feed), and the run state; nothing is
pickled. With a native loader that has `state_dict()`/`load_state_dict()` (torchdata's
`StatefulDataLoader`) the loader's position is the data state (`_stateful`): restored
into the loader before Lightning iterates it, so a resumed run continues at the next
batch; a plain `DataLoader` restarts its epoch (warned at resume).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

import lightning as L
from pipekit_train.core.adapter import (
    FORCING_KEY,
    GRAD_NORM,
    MEMBER_NOISE_KEY,
    Plan,
    RunLifecycle,
    evaluates_as_rollout,
    is_core_dataset,
)

from ._data import TensorBatches, is_datamodule, native_eval_batches
from ._ema import swapped_in
from ._fetch import to_host
from ._grad_norm import grad_norm
from ._lr_scale import apply_lr_scale
from ._model import as_input, module_dtype
from ._state import TrainState, capture_rng, derive_seed, restore_rng, seed_rng
from ._stateful import (
    KIND,
    decode_loader_state,
    is_sized,
    is_stateful_loader,
    loader_position,
    restore_generators,
)

__all__ = ["LightningHooks", "eval_mode"]


@contextmanager
def eval_mode(module: torch.nn.Module) -> Iterator[None]:
    """Eval mode and no autograd inside; the previous mode is restored."""
    was = module.training
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        module.train(was)


def _gather_json(trainer: L.Trainer, obj: Any) -> list[Any]:
    """All-gather one JSON value per process (as uint8 tensors; no pickle on the wire)."""
    data = json.dumps(obj, sort_keys=True).encode()
    device = trainer.strategy.root_device
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    sizes = trainer.strategy.all_gather(size).reshape(-1).tolist()
    padded = torch.zeros(max(sizes), dtype=torch.uint8)
    padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    gathered = trainer.strategy.all_gather(padded.to(device)).reshape(len(sizes), -1).cpu()
    return [json.loads(bytes(gathered[r, : sizes[r]].tolist()).decode()) for r in range(len(sizes))]


def _any_process(trainer: L.Trainer, flags: Any) -> list[bool]:
    """Element-wise "any process" of a list of flags (one all-reduce)."""
    device = trainer.strategy.root_device
    local = torch.tensor([int(bool(f)) for f in flags], dtype=torch.int64, device=device)
    total = trainer.strategy.reduce(local, reduce_op="sum")
    return [bool(v) for v in total.cpu().tolist()]


class LightningHooks(L.Callback):
    """Drive a `RunLifecycle` from Lightning's hooks (see the module docs).

    Args:
        plan: the frozen plan.
        save_module: the module whose state dict is checkpointed (the wrapped network
            for generated modules, the user's `LightningModule` otherwise).
        eval_module: the module validation runs `forward(x)` on.
        loss: the plan's loss, for validation.
        dtype: floating core batches are cast to this dtype (the model's).
        rollout: a `RolloutLoss` (rollout training): validation rolls out the
            longest rollout (`eval_loss`); None: one-step validation.

    Optimizer steps are detected by `trainer.global_step` advancing, so gradient
    accumulation (Lightning batches without a step) needs no configuration here; the
    losses of the accumulated batches (already divided by the number of batches) are
    summed into the step's loss.
    """

    def __init__(
        self,
        plan: Plan,
        *,
        save_module: torch.nn.Module,
        eval_module: torch.nn.Module,
        loss: Callable[[Any, Any], Any],
        dtype: torch.dtype = torch.float32,
        rollout: Any = None,
    ):
        super().__init__()
        self.plan = plan
        self.rollout = rollout
        self.state = TrainState(save_module)
        self.eval_module = eval_module
        self.loss = loss
        self.dtype = dtype
        self.native = not is_core_dataset(plan.data)
        self.run: RunLifecycle | None = None
        self.began = False
        self.rank, self.world = 0, 1
        self._last_global_step = 0
        self._acc: list[Any] = []
        self._norm: Any = None  # the current update's gradient norm (log_grad_norm)
        # a stateful native loader (`_stateful`): the position to restore, the loader it
        # was loaded into, the loader whose position checkpoints save, and an undo for
        # a LightningDataModule's patched `train_dataloader`
        self._position: dict[str, Any] | None = None
        self._loaded_into: Any = None
        self._stateful_loader: Any = None
        self._undo: Callable[[], None] | None = None
        self._epoch_offset = 0  # the epoch a resumed native loader continues

    # -- set-up --------------------------------------------------------------------------
    def learning_rate(self) -> float | None:
        """The first optimizer's first parameter group's rate (None before it exists)."""
        opts = self.state.optimizers
        if not opts:
            return None
        lr = opts[0].param_groups[0].get("lr")
        return None if lr is None else float(lr)

    def start(self, run: RunLifecycle, trainer: L.Trainer) -> TensorBatches | None:
        """Before `Trainer.fit`: restore the latest checkpoint, open the data, bind the run.

        Returns:
            The tensor batches to fit on (core data), or None (a native loader, which
            Lightning iterates itself).
        """
        self.run = run
        self.rank, self.world = int(trainer.global_rank), int(trainer.world_size)
        batches = None
        if self.native:
            _, data_state = run.restore(self.state)
            if (
                isinstance(data_state, Mapping)
                and data_state.get("kind") == KIND
                and self.world == 1
            ):
                self._resume_position(dict(data_state))
        else:
            # this rank's part of every global batch; the saved position is global
            _, feed = run.start(self.state, shard=(self.rank, self.world), track=True)
            batches = TensorBatches(feed, self.dtype)
        state = self.state
        run.bind(
            state=lambda: self._checkpoint_state(trainer),
            eval_batch=self._eval_batch,
            eval_batches=native_eval_batches,
            eval_scope=self._eval_scope,
            data_state=(lambda: self._loader_position(trainer)) if self.native else None,
            lr_scale=lambda scale: apply_lr_scale(state.optimizers, state.schedulers, scale),
            agree=(lambda flags: _any_process(trainer, flags)) if self.world > 1 else None,
        )
        total = run.total_steps
        if total is not None:
            trainer.fit_loop.epoch_loop.max_steps = max(total - run.step, 0)
        return batches

    def _resume_position(self, position: dict[str, Any]) -> None:
        """Load a saved loader position into the loader before Lightning iterates it.

        A `DataLoader` passed as `data` takes it now; a `LightningDataModule`'s
        `train_dataloader()` is wrapped (once) so the loader it returns takes it. The run's
        epoch continues from the saved one (Lightning's own counter starts at 0: at a
        later epoch it would iterate the loader again before the first batch, dropping
        the loaded position).
        """
        state = decode_loader_state(position["state"])
        self._position = position
        data = self.plan.data
        if is_datamodule(data):
            original = data.train_dataloader

            def undo() -> None:
                data.__dict__.pop("train_dataloader", None)
                self._undo = None

            def train_dataloader() -> Any:
                undo()
                loader = original()
                self._load_position(loader, state)
                return loader

            data.train_dataloader = train_dataloader  # type: ignore[method-assign]  # undone by its first call
            self._undo = undo
        else:
            self._load_position(data, state)
        self._epoch_offset = int(position.get("epoch", 0))

    def _load_position(self, loader: Any, state: dict[str, Any]) -> None:
        if is_stateful_loader(loader):
            loader.load_state_dict(state)
            self._loaded_into = loader

    def cleanup(self) -> None:
        """Undo a `train_dataloader` wrapper Lightning never called (a failed fit)."""
        if self._undo is not None:
            self._undo()

    def _start_loader(self, trainer: L.Trainer) -> None:
        """A native loader: check its state can be saved, finish a restore, warn if lost."""
        if not self.native:
            return
        loader = trainer.train_dataloader
        stateful = self.world == 1 and is_stateful_loader(loader) and is_sized(loader)
        saves = self.plan.checkpoint is not None
        self._stateful_loader = loader if stateful and saves else None
        if self._stateful_loader is not None:
            # refuse a state that cannot be saved before the first step, not at a checkpoint
            loader_position(loader, self._epoch_offset)
        position, self._position = self._position, None
        if stateful and position is not None and loader is self._loaded_into:
            restore_generators(loader, position.get("generators", {}))
            return
        step = self.run.step if self.run is not None else 0
        if step:
            warnings.warn(_lost_position(step, loader, stateful, self.world), stacklevel=2)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Apply pending optimizer/scheduler/RNG state, then begin the run."""
        run = self.run
        assert run is not None  # Lightning.run starts the bridge before the fit
        self._start_loader(trainer)
        state = self.state
        state.optimizers = list(trainer.optimizers)
        state.schedulers = [cfg.scheduler for cfg in trainer.lr_scheduler_configs]
        state.apply_pending()
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is not None and "scaler" in state.extra:
            scaler.load_state_dict(state.extra["scaler"])
        device = pl_module.device
        if state.rng:
            if len(state.rng) != self.world:
                warnings.warn(
                    f"The checkpoint holds RNG states of {len(state.rng)} processes, this run has "
                    f"{self.world}; processes without a saved state are seeded afresh.",
                    stacklevel=2,
                )
            if self.rank < len(state.rng):
                restore_rng(state.rng[self.rank], device)
            else:
                seed_rng(derive_seed(self.plan.seed, self.rank, run.step))
        else:
            seed_rng(derive_seed(self.plan.seed, self.rank))
        self._last_global_step = int(trainer.global_step)
        run.begin()
        self.began = True

    # -- per step ------------------------------------------------------------------------
    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Once per optimizer step: end the update (the lifecycle records, validates and
        checkpoints when due); stop when the run is done."""
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        global_step = trainer.global_step
        if global_step == self._last_global_step:  # accumulating gradients
            if loss is not None:
                self._acc.append(loss)
            return
        self._last_global_step = global_step
        if self._acc:
            if loss is not None:
                self._acc.append(loss)
            loss = torch.stack([v.detach().reshape(()) for v in self._acc]).sum()
            self._acc.clear()
        if loss is not None and self.world > 1 and getattr(pl_module, "skipped_update", False):
            # on_nonfinite="skip": every process dropped the update a non-finite loss on one
            # of them caused; each records it as non-finite, so all count the same skips
            # and postpone the same checkpoints (their saves are collective)
            loss = torch.full_like(loss.detach(), float("nan"))
        # a native loader's epochs (the lifecycle uses them when its length is unknown)
        epoch = self._epoch_offset + int(trainer.current_epoch) if self.native else None
        metrics: dict[str, Any] = {} if loss is None else {"loss": loss}
        norm, self._norm = self._norm, None
        if norm is not None:
            metrics[GRAD_NORM] = norm
        assert self.run is not None
        if self.run.end_of_update(metrics, epoch=epoch):
            trainer.should_stop = True

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any
    ) -> None:
        """With `log_grad_norm`: the norm of the gradient this update applies.

        Lightning calls it once per optimizer step, after the last accumulated batch's
        backward (the accumulated gradient) and a grad scaler's unscale, before clipping.
        """
        if self.plan.log_grad_norm:
            self._norm = grad_norm(pl_module).detach()

    # -- validation ----------------------------------------------------------------------
    def _eval_batch(self, batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray, float]:
        """`(predictions, mean loss)` of one numpy batch with `eval_module`."""
        module = self.eval_module
        dtype, device = module_dtype(module)
        if self.rollout is not None and evaluates_as_rollout(batch, self.rollout.rollout):
            # windows: the longest rollout, without noise; pairs (`state.predict`, e.g.
            # RolloutMonitor's one-step calls): one model application, below
            keys = [k for k in ("x", "y", FORCING_KEY, MEMBER_NOISE_KEY) if k in batch]
            inputs = {k: as_input(batch[k], dtype, device) for k in keys}
            pred, loss = self.rollout.eval_loss(module, inputs)
            return to_host(pred), float(loss)
        pred = module(as_input(batch["x"], dtype, device))
        target = as_input(batch["y"], dtype, device)
        loss = self.loss(pred, target)
        return to_host(pred), float(loss)

    @contextmanager
    def _eval_scope(self) -> Iterator[None]:
        """Eval mode without autograd; with `optimizer_config["ema"]` the module holds
        the moving average meanwhile."""
        with eval_mode(self.eval_module), swapped_in(self.state.optimizers):
            yield

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Lightning's own validation loop (user modules with `validation_step`): record `val*` metrics."""
        if trainer.sanity_checking or self.run is None or not self.began:
            return
        metrics = {
            k: float(v)
            for k, v in trainer.callback_metrics.items()
            if k.startswith("val") and _scalar(v)
        }
        if metrics:
            self.run.record_validation(metrics)

    # -- checkpoints ---------------------------------------------------------------------
    def _checkpoint_state(self, trainer: L.Trainer) -> TrainState:
        """The state a checkpoint saves (called on every process: the RNG states of all
        processes are gathered), with the global step and a grad scaler's state."""
        record = capture_rng(trainer.lightning_module.device)
        rngs = _gather_json(trainer, record) if self.world > 1 else [record]
        state = self.state
        state.rng = rngs
        extra: dict[str, Any] = {"global_step": int(trainer.global_step)}
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is not None:
            extra["scaler"] = {k: _jsonable(v) for k, v in scaler.state_dict().items()}
        state.extra = extra
        return state

    def _loader_position(self, trainer: L.Trainer) -> dict[str, Any] | None:
        """The position of a stateful native loader to save (None for another loader).

        Lightning reads no batch ahead of a sized loader: this is the position after the
        batch just trained on (of the loader now in use: Lightning may reload it every n
        epochs).
        """
        if self._stateful_loader is None:
            return None
        loader = trainer.train_dataloader
        if not is_stateful_loader(loader):
            return None
        return loader_position(loader, self._epoch_offset + int(trainer.current_epoch))


def _lost_position(step: int, loader: Any, stateful: bool, world: int) -> str:
    """The warning of a resume whose native loader starts its epoch again."""
    name = type(loader).__name__
    head = f"Resuming at step {step}, but the training loader ({name}) "
    tail = (
        ": it restarts its epoch from the first batch, so the resumed run sees other batches "
        "than an uninterrupted one (weights, optimizer and RNG are restored)."
    )
    if not stateful and world > 1:
        return head + f"runs in {world} processes, where its position is not checkpointed" + tail
    if not stateful and is_stateful_loader(loader):
        return (
            head + "has no length, so Lightning reads a batch ahead and its saved position "
            "would skip one" + tail + " Give the dataset a __len__ for an exact resume."
        )
    if not stateful:
        return (
            head + "has no state_dict()" + tail + " For an exact resume use torchdata's "
            "StatefulDataLoader (`pip install 'pipekit-train-lightning[stateful]'`), a drop-in "
            "replacement for torch.utils.data.DataLoader."
        )
    return head + "has no saved position in the checkpoint" + tail


def _scalar(v: Any) -> bool:
    return not isinstance(v, torch.Tensor) or v.numel() == 1


def _jsonable(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.item() if v.numel() == 1 else v.tolist()
    return v
