"""`Lightning`: the adapter that runs a plan with `lightning.Trainer.fit`.

Importing this module does not import lightning (≈14 s cold); `run()` does.
"""

from __future__ import annotations

import copy
import json
import logging
import random
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from pipekit_train.core.adapter import (
    Adapter,
    Capabilities,
    ConfigError,
    Plan,
    Precision,
    RunLifecycle,
    TrainingArtifact,
    adjusts_learning_rate,
    is_core_dataset,
)

from ._checkpoint import checkpointer
from ._data import is_datamodule, is_native_loader
from ._ema import averaged_copy
from ._fetch import fetch
from ._losses import torch_loss
from ._model import TorchModelOp, is_lightning_module, module_dtype
from ._nvml import without_nvml_check
from ._optim import build_optimizer, check_optimizer_config, gradient_clip
from ._precision import native_precision
from ._probe import expected_input_shape, output_shape, stepper_shape
from ._rollout import RolloutLoss
from ._trainer_kwargs import TRAINER_KWARGS

__all__ = ["Lightning"]


# Lines Lightning logs at INFO on every run that say nothing about this run: the product
# tip of `Trainer()`, its "GPU available: … / TPU available: …" device banners, the
# "LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES: […]" line of `fit` on CUDA, and "`Trainer.fit`
# stopped: `max_steps=N` reached." (the adapter sets max_steps: every run ends that way).
# Other INFO lines (precision, Tensor Core hints) and every warning stay.
_BANNERS = (
    "💡 Tip",
    "GPU available:",
    "TPU available:",
    "HPU available:",
    "LOCAL_RANK:",
    "`Trainer.fit` stopped: `max_steps=",
)
_BANNER_LOGGERS = (
    "lightning.pytorch.utilities.rank_zero",
    "lightning.fabric.utilities.rank_zero",
    "lightning.pytorch.accelerators.cuda",
)


class _DropAdvert(logging.Filter):
    """Drops Lightning's per-run tip and device banners (`_BANNERS`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_BANNERS)


@contextmanager
def _without_advert() -> Iterator[None]:
    """While the adapter builds and fits its `Trainer`, hide Lightning's tip and banners."""
    loggers = [logging.getLogger(name) for name in _BANNER_LOGGERS]
    advert = _DropAdvert()
    for logger in loggers:
        logger.addFilter(advert)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(advert)


_OWNED = {
    "max_steps": "TrainingLoop(max_steps=...)",
    "max_epochs": "TrainingLoop(max_epochs=...)",
    "min_steps": "TrainingLoop(max_steps=...) and callbacks",
    "min_epochs": "TrainingLoop(max_epochs=...) and callbacks",
    "max_time": "a callback calling state.request_stop(...)",
    "limit_train_batches": "TrainingLoop(max_steps=...)",
    "fast_dev_run": "TrainingLoop(max_steps=1)",
    "overfit_batches": "a small ArrayDataset",
    "accumulate_grad_batches": "TrainingLoop(accumulate_grad_batches=k) (the same meaning on every backend)",
}


def _overrides(module: Any, name: str) -> bool:
    for cls in type(module).__mro__:
        if name in cls.__dict__:
            return cls.__module__.split(".")[0] not in ("lightning", "pytorch_lightning")
    return False


def _jsonable(value: Any) -> Any:
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError):
        return repr(value)


@contextmanager
def _rng_guard() -> Iterator[None]:
    """Leave the caller's global torch/numpy/python RNG states as they were."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            np.random.set_state(np_state)
            random.setstate(py_state)


class Lightning(Adapter):
    """Run a `TrainingLoop` with PyTorch Lightning's `Trainer.fit`.

    Keyword arguments are forwarded to `lightning.Trainer` (e.g. `devices`, `strategy`,
    `precision`, `callbacks` with
    Lightning callbacks, `logger`). The adapter sets quiet defaults — no Lightning
    logger, checkpointing, progress bar or model summary (core's writers, `Checkpoint`
    and `ProgressBar` do those jobs) — which explicit arguments override. Lightning's
    "GPU available: … / TPU available: …" device banners are not printed. The run length
    belongs to `TrainingLoop` (`max_steps`, `max_epochs`), so Lightning's own stopping
    arguments are refused. `precision` takes core's names (`"float32"`,
    `"bfloat16-mixed"`, `"float16-mixed"`, the same on every backend) or Lightning's own.

    Gradient accumulation is `TrainingLoop(accumulate_grad_batches=k)`, forwarded to
    Lightning's argument of that name: an update averages `k` batches of `batch_size`.
    Gradient clipping is `optimizer_config["clip_norm"]` / `["clip_value"]`.
    With `strategy="ddp"` `batch_size` is the global batch: each process trains on its
    `batch_size / world_size` rows of every batch (the same batches as one process);
    only global rank 0 writes metrics and checkpoints.

    Args:
        **trainer_kwargs: `lightning.Trainer` keyword arguments.

    Raises:
        ConfigError: an unknown Trainer argument, or one that `TrainingLoop` owns.

    Examples:
        >>> from pipekit_train.core import TrainingLoop
        >>> from pipekit_train.core.testing import regression_task
        >>> from pipekit_train.lightning import Lightning, TorchModelOp
        >>> train, val = regression_task(in_size=2)
        >>> loop = TrainingLoop(model=TorchModelOp("pipekit_train.lightning.testing:mlp",
        ...                     in_size=2, out_size=1), data=train, batch_size=64, max_steps=500,
        ...                     adapter=Lightning(precision="bfloat16-mixed"))
        >>> artifact = loop.run()  # doctest: +SKIP
    """

    name = "lightning"
    native_loaders = "a torch DataLoader or a LightningDataModule"
    capabilities = Capabilities.full(fused_steps=False, sharding=False, seed_groups=False)

    def __init__(self, **trainer_kwargs: Any):
        for key, value in trainer_kwargs.items():
            if key in _OWNED:
                raise ConfigError(
                    f"`{key}` is not a Lightning() argument: the run length belongs to the "
                    f"TrainingLoop. Received: {key}={value!r}. Use {_OWNED[key]} instead."
                )
            if key not in TRAINER_KWARGS:
                raise ConfigError(
                    f"`{key}` is not a lightning.Trainer argument. Received: {key}={value!r}. "
                    f"Use some of {sorted(TRAINER_KWARGS)}."
                )
        strategy = trainer_kwargs.get("strategy")
        if isinstance(strategy, str) and any(w in strategy for w in ("spawn", "fork", "notebook")):
            raise ConfigError(
                "Forking and spawning strategies run global rank 0 in a child process, so the run's "
                f"artifact, callbacks and writers would not come back. Received: strategy={strategy!r}. "
                "Use strategy='ddp' (Lightning re-runs the script for the other ranks)."
            )
        self.spec_precision: Precision | None = Precision.FLOAT32
        if "precision" in trainer_kwargs and trainer_kwargs["precision"] is not None:
            trainer_kwargs["precision"], self.spec_precision = native_precision(
                trainer_kwargs["precision"]
            )
        self.trainer_kwargs = dict(trainer_kwargs)

    def get_config(self) -> dict[str, Any]:
        """`{"type": "pipekit_train.lightning:Lightning", "kwargs": ...}` (objects as their repr)."""
        return {
            "type": "pipekit_train.lightning:Lightning",
            "kwargs": {k: _jsonable(v) for k, v in sorted(self.trainer_kwargs.items())},
        }

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in sorted(self.trainer_kwargs.items()))
        return f"Lightning({args})"

    # -- data ------------------------------------------------------------------------------
    def accepts_data(self, data: Any) -> bool:
        """Torch `DataLoader`s (incl. `StatefulDataLoader`) and `LightningDataModule`s."""
        return is_native_loader(data)

    # -- validation --------------------------------------------------------------------------
    def _check_model(self, model: Any) -> None:
        if isinstance(model, TorchModelOp) or isinstance(model, torch.nn.Module):
            return
        raise ConfigError(
            "The Lightning adapter trains a TorchModelOp, a torch.nn.Module or a LightningModule. "
            f"Received: model={type(model).__name__}. Wrap the network, e.g. "
            "TorchModelOp('my_pkg.models:net', in_size=..., out_size=...)."
        )

    def _uses_plan_optimizer(self, model: Any) -> bool:
        return not (is_lightning_module(model) and _overrides(model, "configure_optimizers"))

    def validate(self, plan: Plan) -> None:
        """Raise `ConfigError` for anything this backend cannot run (before any work)."""
        self._check_model(plan.model)
        if plan.sharding is not None:
            raise ConfigError(
                "The Lightning adapter distributes through Lightning's strategies, not `sharding`. "
                f"Received: sharding={plan.sharding!r}. Use Lightning(devices=..., strategy='ddp')."
            )
        if self._uses_plan_optimizer(plan.model):
            check_optimizer_config(plan.optimizer_config, plan.total_steps)
        clip = gradient_clip(plan.optimizer_config)
        given = self.trainer_kwargs.get("gradient_clip_val")
        if clip is not None and given is not None:
            key = "clip_norm" if clip[1] == "norm" else "clip_value"
            raise ConfigError(
                f"`optimizer_config['{key}']` and Lightning(gradient_clip_val=...) both clip. "
                f"Received: {key}={clip[0]}, gradient_clip_val={given}. Set only `{key}` "
                "(it means the same on every backend)."
            )
        if adjusts_learning_rate(plan) and not self._uses_plan_optimizer(plan.model):
            raise self._unsupported(
                "A callback that changes the learning rate (ReduceLROnPlateau) with your "
                "LightningModule's own configure_optimizers",
                f"model={type(plan.model).__name__}",
                "Drop configure_optimizers so the adapter builds the optimizer from "
                "optimizer_config, or pass the network (a torch.nn.Module or TorchModelOp).",
            )
        if plan.on_nonfinite == "skip" and is_lightning_module(plan.model):
            raise self._unsupported(
                "on_nonfinite='skip' with your own LightningModule",
                f"model={type(plan.model).__name__}, on_nonfinite='skip'",
                "Pass the network (a torch.nn.Module or TorchModelOp) so the adapter's "
                "training step can drop non-finite updates, or use on_nonfinite='stop'.",
            )
        if plan.rollout is not None and is_lightning_module(plan.model):
            raise self._unsupported(
                "Rollout training with your own LightningModule",
                f"model={type(plan.model).__name__}, rollout=Rollout(steps={plan.rollout.steps})",
                "Pass the network (a torch.nn.Module or TorchModelOp) so the adapter's "
                "training step unrolls it, or drop `rollout`.",
            )
        if is_datamodule(plan.data) and plan.validation is not None:
            raise ConfigError(
                "A LightningDataModule brings its own validation data. "
                f"Received: validation={type(plan.validation).__name__}. Drop `validation=`, or pass "
                "a DataLoader as `data=` instead."
            )

    def reports_own_validation_metrics(self, plan: Plan) -> bool:
        """Your own `LightningModule` (or a `LightningDataModule`'s loaders) may log `val*`
        metrics from Lightning's validation loop: their names are known only at run time."""
        return is_lightning_module(plan.model) or is_datamodule(plan.data)

    def validate_online(self, plan: Plan) -> None:
        """Checks for `OnlineTrainer` (plain-torch steps)."""
        model = plan.model
        if not isinstance(model, (TorchModelOp, torch.nn.Module)):
            raise ConfigError(
                "OnlineTrainer on the Lightning backend needs a TorchModelOp or a torch.nn.Module. "
                f"Received: model={type(model).__name__}."
            )
        check_optimizer_config(plan.optimizer_config, plan.total_steps)

    def step_backend(self, plan: Plan) -> Any:
        """The plain-torch step backend (`OnlineTrainer`)."""
        from ._step_backend import TorchStepBackend

        return TorchStepBackend(plan)

    # -- shape probe -------------------------------------------------------------------------
    def output_shape(
        self, model: Any, input_shape: tuple[int, ...], dtype: Any = np.float32
    ) -> tuple[int, ...] | None:
        """The prediction's shape, from a forward pass of one zero row.

        Run in eval mode under `torch.no_grad()` and a forked torch RNG; the module's
        training mode is restored. Only plain `forward(x)` networks are probed: a user
        `LightningModule` (its `training_step` decides what reaches the model), a module
        with uninitialised lazy layers (the probe would initialise them) or another
        `forward` signature gives None.
        """
        return output_shape(model, input_shape, dtype)

    def stepper_shape(
        self, stepper: Any, state_shape: tuple[int, ...], dtype: Any = np.float32
    ) -> tuple[int, ...] | None:
        """The stepper's output shape on a batch of zero states (CPU tensors, no autograd)."""
        return stepper_shape(stepper, state_shape, dtype)

    def expected_input_shape(self, model: Any) -> tuple[int, ...] | None:
        """`(in_features,)` of a `torch.nn.Sequential` that starts with a `Linear` layer."""
        return expected_input_shape(model)

    # -- running -----------------------------------------------------------------------------
    def _trainer_kwargs(self, plan: Plan, native: bool, callbacks: list[Any]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
            "max_epochs": -1,
            "max_steps": -1 if plan.total_steps is None else int(plan.total_steps),
            "accumulate_grad_batches": plan.accumulate_grad_batches,
        }
        if not native:
            kwargs["use_distributed_sampler"] = False
        clip = gradient_clip(plan.optimizer_config)
        if clip is not None and self._uses_plan_optimizer(plan.model):
            kwargs["gradient_clip_val"], kwargs["gradient_clip_algorithm"] = clip
        kwargs.update(self.trainer_kwargs)
        user = kwargs.pop("callbacks", None)
        if user is not None and not isinstance(user, (list, tuple)):
            user = [user]
        kwargs["callbacks"] = [*callbacks, *(user or [])]
        return kwargs

    def run(self, plan: Plan) -> TrainingArtifact:
        """Train with `Trainer.fit`, resuming from the latest complete checkpoint.

        The run's `RunLifecycle` is built around the fit (leaving it by an exception
        aborts the run); the bridge (`LightningHooks`) drives it from Lightning's hooks.
        """
        import lightning as L

        from ._bridge import LightningHooks
        from ._module import PlanModule

        model = plan.model
        native = not is_core_dataset(plan.data)
        if isinstance(model, TorchModelOp):
            net = copy.deepcopy(model.model)
        elif is_lightning_module(model):
            net = model
        else:
            net = copy.deepcopy(model)
        net.train()
        total = plan.total_steps
        loss = torch_loss(plan.loss)

        def build(params: Any) -> tuple[Any, Any]:
            return build_optimizer(
                plan.optimizer_config,
                params,
                total_steps=total,
                lr_scale=adjusts_learning_rate(plan),
            )

        patched = False
        if is_lightning_module(net):
            module = net
            if not _overrides(net, "configure_optimizers"):

                def configure_optimizers() -> Any:
                    return _as_lightning_optimizers(build(net.parameters()))

                module.configure_optimizers = configure_optimizers
                patched = True
        dtype, _ = module_dtype(net)
        rollout = RolloutLoss.of(plan, loss)
        bridge = LightningHooks(
            plan, save_module=net, eval_module=net, loss=loss, dtype=dtype, rollout=rollout
        )
        if is_lightning_module(net):
            callbacks = [bridge]  # your module's hooks stay yours: the bridge is a Callback
        else:
            module = PlanModule(
                net,
                loss,
                build,
                bridge=bridge,
                skip_nonfinite=plan.on_nonfinite == "skip",
                rollout=rollout,
            )
            callbacks = []  # the generated module forwards its hooks to the bridge
        with _without_advert():
            trainer = L.Trainer(**self._trainer_kwargs(plan, native, callbacks))
        if type(trainer.strategy.launcher).__name__ == "_MultiProcessingLauncher":
            raise ConfigError(
                "This strategy starts its processes with fork/spawn, so global rank 0 would not run in "
                f"this process. Received: strategy={trainer.strategy!r}. Use strategy='ddp'."
            )
        _stand_aside(trainer)
        rank, world = int(trainer.global_rank), int(trainer.world_size)
        if not native and plan.batch_size % world:
            raise ConfigError(
                "`batch_size` (the global batch) must split evenly over the "
                f"{world} processes. Received: batch_size={plan.batch_size}. Use a multiple "
                f"of {world}."
            )
        with RunLifecycle(
            plan,
            checkpointer=checkpointer(plan.checkpoint) if plan.checkpoint is not None else None,
            fetch=fetch,
            learning_rate=bridge.learning_rate,
            is_chief=rank == 0,
            processes=world,
        ) as run:
            try:
                with (
                    _rng_guard(),
                    without_nvml_check(),
                    _without_advert(),
                    warnings.catch_warnings(),
                ):
                    # Lightning 2.6's pytree helper uses an API torch 2.15 deprecates (once per fit)
                    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
                    if plan.validation is not None:  # validated by the run, not Lightning's loop
                        warnings.filterwarnings(
                            "ignore",
                            message=r"You defined a `validation_step` but have no `val_dataloader`",
                        )
                    batches = bridge.start(run, trainer)
                    if is_datamodule(plan.data):
                        trainer.fit(module, datamodule=plan.data)
                    else:
                        trainer.fit(module, train_dataloaders=plan.data if native else batches)
                # with restore_best: the best checkpoint, loaded into `net` (and the
                # optimizers' moving average) as a resume loads it
                run.final_state(bridge.state)
                net.train(False)
                # with optimizer_config["ema"]: the artifact's model holds the average
                averaged = averaged_copy(net, bridge.state.optimizers)

                def op_of(module: Any) -> TorchModelOp:
                    if isinstance(model, TorchModelOp):
                        return model.with_model(module)
                    return TorchModelOp.wrap(module, seed=plan.seed)

                raw = op_of(net)
                return run.finish(
                    raw if averaged is None else op_of(averaged),
                    raw_model=None if averaged is None else raw,
                    extra={"global_rank": rank, "world_size": world},
                )
            finally:
                bridge.cleanup()
                if patched:
                    del module.configure_optimizers


def _stand_aside(trainer: Any) -> None:
    """Keep Lightning's own signal handling out of the run: core's lifecycle handles
    preemption. Lightning 2.6 installs a SIGTERM handler at every `fit` (it logs, kills
    launched children and broadcasts from inside the handler) and, under SLURM with
    auto-requeue, a SIGUSR1 one; it has no public switch, so its connector's
    registration is replaced with a no-op for this trainer."""
    connector = getattr(trainer, "_signal_connector", None)
    if connector is not None and callable(getattr(connector, "register_signal_handlers", None)):
        connector.register_signal_handlers = lambda: None


def _as_lightning_optimizers(built: tuple[Any, Any]) -> Any:
    optimizer, scheduler = built
    if scheduler is None:
        return optimizer
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
