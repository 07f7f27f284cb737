"""`Torch`: plain PyTorch on core's run loop — no Lightning loop, `lightning` never imported.

The adapter is a `StepAdapter`: core's `run_step_loop` runs the whole loop (batching,
callbacks, writers, validation and checkpoint schedules, exact resume, the artifact, and
whatever run-level features core adds) over `TorchStepBackend` (`_step_backend.py`), whose
update is the loop a PyTorch user writes by hand.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from pipekit_train.core.adapter import (
    Capabilities,
    ConfigError,
    Plan,
    StepAdapter,
    TrainingArtifact,
    positive_int,
    resolve_precision,
    run_step_loop,
)
from pipekit_train.lightning._data import is_datamodule
from pipekit_train.lightning._model import TorchModelOp, is_lightning_module
from pipekit_train.lightning._nvml import without_nvml_check
from pipekit_train.lightning._optim import check_optimizer_config
from pipekit_train.lightning._probe import expected_input_shape, output_shape, stepper_shape
from pipekit_train.lightning._trainer_kwargs import TRAINER_KWARGS

from ._compile import CUDA_GRAPHS, compile_options
from ._determinism import is_deterministic
from ._distributed import DataParallel, launched_world_size
from ._graphs import CAPTURABLE_OPTIMIZERS
from ._step_backend import TorchStepBackend

__all__ = ["Torch"]

_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs", CUDA_GRAPHS)
_POINTER = "Use adapter=Lightning(...) for Lightning's strategies, devices and plugins."


class Torch(StepAdapter):
    """Train a `torch.nn.Module` (or `TorchModelOp`) with a plain torch loop.

    Each optimizer update is what a hand-written loop does (`zero_grad`, forward and
    loss, `backward`, clip, `step`, schedule): with float32 and one step per call it
    ends bit-identical to such a loop over the same batches. It runs the whole canonical
    spec (every optimizer, decoupled weight decay, clipping, every schedule, gradient
    accumulation, the non-finite policies, core's three precisions), core datasets and
    torch `DataLoader`s, `OnlineTrainer`, and exact resume. It trains on one device per
    process; in a process that joined an initialized `torch.distributed` process group
    of several (Ray Train's `TorchTrainer`, or `init_process_group` under `torchrun`) it
    trains data-parallel, as DDP does: each process takes its part of every global batch
    of a pipekit dataset and the gradients are averaged with one all-reduce per update
    (`_distributed.py`). For Lightning's strategies (FSDP, several devices per process),
    a `LightningModule` or a `LightningDataModule` use `Lightning()`.

    Args:
        steps_per_execution: fused steps: the most optimizer updates one call runs (core
            stacks their batches and fetches their losses once). Callbacks and writers
            still see every step, with the same numbers as `steps_per_execution=1`.
        precision: `"float32"`, `"bfloat16-mixed"` or `"float16-mixed"` (autocast over
            forward and loss; float16 with a `GradScaler`).
        compile: opt-in compilation. True, a mode name (`"default"`, `"reduce-overhead"`,
            `"max-autotune"`, ...) or a dict of `torch.compile` arguments: `torch.compile`
            of the forward-and-loss function; the first step compiles (timed: see
            `compile_report`); if compilation fails the run warns and continues eagerly.
            `"cuda-graphs"` (CUDA only): the whole update — forward, loss, backward,
            clipping, the optimizer step, the moving average — captured once as a CUDA
            graph and replayed (one launch per update; `_graphs.py`), with Adam/AdamW,
            float32 or bfloat16-mixed, and a model without random layers (anything else
            is refused before the run). A compiled step may differ from the eager one by
            float rounding; a resumed run equals an uninterrupted one in either mode.
        fused_optimizer: build the optimizer with torch's fused kernel (`fused=True`,
            all but rmsprop): faster on small models, equal to the default build to
            float rounding, not bit for bit.
        device: where to train (`"cpu"`, `"cuda"`, `"cuda:1"`, a `torch.device`; None:
            where the model's parameters are). Batches go there through pinned memory
            with non-blocking copies on CUDA.

    Attributes:
        compile_report: after a run with `compile=`: `{"compiled", "compile_seconds",
            "fell_back"}`; with `"cuda-graphs"`: `{"cuda_graphs", "captured_at_update",
            "eager_updates", "fell_back"}` (None before, or without `compile=`).

    Raises:
        ConfigError: a bad option, or a Lightning-only option (with a pointer to
            `Lightning()`).

    Examples:
        >>> from pipekit_train.core import TrainingLoop
        >>> from pipekit_train.core.testing import regression_task
        >>> from pipekit_train.lightning import TorchModelOp, Torch
        >>> train, val = regression_task(in_size=4)
        >>> art = TrainingLoop(
        ...     model=TorchModelOp("pipekit_train.lightning.testing:mlp", in_size=4, out_size=1),
        ...     data=train, batch_size=32, max_steps=20, progress=False,
        ...     adapter=Torch(steps_per_execution=10)).run()
        >>> art.steps
        20
    """

    name = "torch"
    native_loaders = "a torch DataLoader"
    capabilities = Capabilities.full(sharding=False, seed_groups=False)

    def __init__(
        self,
        *,
        steps_per_execution: int = 1,
        precision: str = "float32",
        compile: bool | str | Mapping[str, Any] = False,
        fused_optimizer: bool = False,
        device: str | torch.device | None = None,
        **lightning_only: Any,
    ):
        for key, value in lightning_only.items():
            if key in TRAINER_KWARGS or key in ("max_steps", "max_epochs"):
                raise ConfigError(
                    f"`{key}` is a Lightning() option: Torch() trains on one device per "
                    f"process with a plain torch loop. Received: {key}={value!r}. {_POINTER}"
                )
            raise ConfigError(
                f"`{key}` is not a Torch() argument. Received: {key}={value!r}. Use "
                "steps_per_execution, precision, compile, fused_optimizer or device."
            )
        steps_per_execution = positive_int("steps_per_execution", steps_per_execution, example="10")
        self.steps_per_execution = int(steps_per_execution)
        self.precision = resolve_precision(precision)
        if not (
            compile in (True, False, None)
            or (isinstance(compile, str) and compile in _MODES)
            or (isinstance(compile, Mapping) and all(isinstance(k, str) for k in compile))
        ):
            raise ConfigError(
                f"`compile` must be True/False, one of {list(_MODES)} or a dict of "
                f"torch.compile arguments. Received: compile={compile!r}. Use compile=True."
            )
        self.compile = False if compile is None else compile
        if not isinstance(fused_optimizer, bool):
            raise ConfigError(
                "`fused_optimizer` must be True or False. Received: "
                f"fused_optimizer={fused_optimizer!r}."
            )
        self.fused_optimizer = fused_optimizer
        try:
            self.device = None if device is None else torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ConfigError(
                f"`device` must name a torch device. Received: device={device!r} ({exc}). "
                "Use 'cpu' or 'cuda'."
            ) from exc
        self.compile_report: dict[str, Any] | None = None

    # -- description -----------------------------------------------------------------------
    def _kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if self.steps_per_execution != 1:
            kwargs["steps_per_execution"] = self.steps_per_execution
        if self.precision != "float32":
            kwargs["precision"] = self.precision
        if self.compile is not False:
            kwargs["compile"] = json.loads(json.dumps(self.compile, default=repr))
        if self.fused_optimizer:
            kwargs["fused_optimizer"] = True
        if self.device is not None:
            kwargs["device"] = str(self.device)
        return kwargs

    def get_config(self) -> dict[str, Any]:
        """`{"type": "pipekit_train.lightning:Torch", "kwargs": ...}` (non-default options)."""
        return {"type": "pipekit_train.lightning:Torch", "kwargs": self._kwargs()}

    def __repr__(self) -> str:
        return f"Torch({', '.join(f'{k}={v!r}' for k, v in self._kwargs().items())})"

    # -- data ------------------------------------------------------------------------------
    def accepts_data(self, data: Any) -> bool:
        """Torch `DataLoader`s (a `LightningDataModule` needs `Lightning()`)."""
        return isinstance(data, torch.utils.data.DataLoader)

    # -- validation ------------------------------------------------------------------------
    def _device_of(self, plan: Plan) -> torch.device:
        if self.device is not None:
            return self.device
        net = plan.model.model if isinstance(plan.model, TorchModelOp) else plan.model
        if isinstance(net, torch.nn.Module):  # validate() accepts modules only
            for p in net.parameters():
                return p.device
        return torch.device("cpu")

    def _check_model(self, model: Any) -> None:
        if is_lightning_module(model) or (
            isinstance(model, TorchModelOp) and is_lightning_module(model.model)
        ):
            raise self._unsupported(
                "A LightningModule (its training_step and configure_optimizers belong to "
                "Lightning's loop)",
                f"model={type(model).__name__}",
                "Use adapter=Lightning(), or pass the plain torch.nn.Module inside it.",
            )
        if not isinstance(model, (TorchModelOp, torch.nn.Module)):
            raise ConfigError(
                "Torch() trains a TorchModelOp or a torch.nn.Module. Received: "
                f"model={type(model).__name__}. Wrap the network, e.g. "
                "TorchModelOp('my_pkg.models:net', in_size=..., out_size=...)."
            )

    def validate(self, plan: Plan) -> None:
        """Raise `ConfigError` for anything `Torch()` cannot run (before any work)."""
        self._check_model(plan.model)
        self._check_processes(plan)
        for field in ("data", "validation"):
            if is_datamodule(getattr(plan, field)):
                raise self._unsupported(
                    "A LightningDataModule",
                    f"{field}={type(getattr(plan, field)).__name__}",
                    "Pass its DataLoaders (datamodule.train_dataloader()) or use "
                    "adapter=Lightning().",
                )
        self.validate_online(plan)

    def validate_online(self, plan: Plan) -> None:
        """Checks shared by `TrainingLoop` and `OnlineTrainer`: model, optimizer, device."""
        self._check_model(plan.model)
        check_optimizer_config(plan.optimizer_config, plan.total_steps)
        device = self._device_of(plan)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(
                f"`device` is a CUDA device but torch sees no CUDA GPU. Received: device={str(device)!r}. "
                "Use device='cpu'."
            )
        if self.compile == CUDA_GRAPHS and device.type != "cuda":
            raise ConfigError(
                "CUDA-graph mode replays captured CUDA kernels, so it needs a CUDA device. "
                f"Received: compile='cuda-graphs' on device={str(device)!r}. Use compile=True "
                "(or False) on the CPU, or device='cuda'."
            )
        if self.compile is not False and plan.rollout is not None:
            raise self._unsupported(
                "Rollout training with `compile`",
                f"compile={self.compile!r}, rollout=Rollout(steps={plan.rollout.steps})",
                "The unrolled steps run eagerly: use compile=False with `rollout`.",
            )
        if self.compile == CUDA_GRAPHS:
            self._check_capturable(plan)
        if self.fused_optimizer and not isinstance(plan.optimizer_config, Mapping):
            raise ConfigError(
                "`fused_optimizer` builds the optimizer from the canonical spec. Received: "
                "fused_optimizer=True with a callable optimizer_config. Pass fused=True to "
                "your own optimizer instead, or use a dict optimizer_config."
            )

    def _check_processes(self, plan: Plan) -> None:
        """Data parallel runs: a process group to join, and what it cannot run."""
        if not DataParallel.joined():
            world = launched_world_size()
            if world > 1:
                raise ConfigError(
                    "Torch() trains data-parallel over torch.distributed's default process "
                    f"group, which this process has not joined. Received: WORLD_SIZE={world}. "
                    "Call torch.distributed.init_process_group('gloo') (or 'nccl') before the "
                    "run, or launch it with pipekit_train.lightning.ray.fit_on_ray."
                )
            return
        world = torch.distributed.get_world_size()
        for field in ("data", "validation"):
            if self.accepts_data(getattr(plan, field)):
                raise ConfigError(
                    f"A torch DataLoader `{field}` is not supported in a data-parallel Torch() "
                    f"run: every process would read all of it. Received: {field}="
                    f"{type(getattr(plan, field)).__name__}, processes={world}. Use a pipekit "
                    "dataset (core gives each process its part of every batch)."
                )
        if self.compile == CUDA_GRAPHS:
            raise ConfigError(
                "compile='cuda-graphs' captures one process's update; the gradient "
                f"all-reduce of a data-parallel run is not in it. Received: processes={world}. "
                "Use compile=True or False."
            )

    def _check_capturable(self, plan: Plan) -> None:
        """Refuse what a whole-update CUDA graph cannot hold (`_graphs.py`), naming the fix."""
        config = plan.optimizer_config
        name = config.get("name") if isinstance(config, Mapping) else None
        if name not in CAPTURABLE_OPTIMIZERS:
            shown = name if name is not None else type(config).__name__
            raise ConfigError(
                "compile='cuda-graphs' captures the optimizer step, which torch can do for "
                f"{list(CAPTURABLE_OPTIMIZERS)} (their capturable implementations). Received: "
                f"optimizer={shown!r}. Use one of those, or compile=True / False."
            )
        if self.fused_optimizer:
            raise ConfigError(
                "compile='cuda-graphs' replays the whole update as one graph, with torch's "
                "capturable optimizer. Received: fused_optimizer=True. Drop fused_optimizer."
            )
        if self.precision == "float16-mixed":
            raise ConfigError(
                "compile='cuda-graphs' cannot capture float16 loss scaling (the GradScaler "
                "checks for infinities on the host every step). Received: "
                "precision='float16-mixed'. Use 'bfloat16-mixed' or 'float32'."
            )
        if plan.on_nonfinite == "skip":
            raise ConfigError(
                "compile='cuda-graphs' cannot skip an update from the host after looking at "
                "its loss. Received: on_nonfinite='skip'. Use on_nonfinite='stop' (checked "
                "when the losses are fetched) or 'ignore', or compile=False."
            )
        net = plan.model.model if isinstance(plan.model, TorchModelOp) else plan.model
        if isinstance(net, torch.nn.Module) and not is_deterministic(net):
            raise ConfigError(
                "compile='cuda-graphs' needs a model that draws no random numbers (its CUDA "
                "random state is not part of the checkpoint, so a resume would not be exact). "
                f"Received: model={type(net).__name__} with random layers (e.g. Dropout). "
                "Use compile=False or compile=True for this model."
            )

    # -- shape probe -----------------------------------------------------------------------
    def output_shape(
        self, model: Any, input_shape: tuple[int, ...], dtype: Any = np.float32
    ) -> tuple[int, ...] | None:
        """The prediction's shape, from a forward pass of one zero row (as `Lightning`)."""
        return output_shape(model, input_shape, dtype)

    def stepper_shape(
        self, stepper: Any, state_shape: tuple[int, ...], dtype: Any = np.float32
    ) -> tuple[int, ...] | None:
        """The stepper's output shape on a batch of zero states (CPU tensors, no autograd)."""
        return stepper_shape(stepper, state_shape, dtype)

    def expected_input_shape(self, model: Any) -> tuple[int, ...] | None:
        """`(in_features,)` of a `torch.nn.Sequential` that starts with a `Linear` layer."""
        return expected_input_shape(model)

    # -- running ---------------------------------------------------------------------------
    def step_backend(self, plan: Plan) -> TorchStepBackend:
        """The plain-torch step backend of one run (also `OnlineTrainer`'s)."""
        return TorchStepBackend(
            plan,
            steps_per_execution=self.steps_per_execution,
            precision=self.precision,
            compile=self.compile,
            fused_optimizer=self.fused_optimizer,
            device=self.device,
        )

    def run(self, plan: Plan) -> TrainingArtifact:
        """Train with core's step loop and return the artifact."""
        backend = self.step_backend(plan)
        try:
            with without_nvml_check():  # set by `import lightning` anywhere in the process
                return run_step_loop(plan, backend)
        finally:
            if compile_options(self.compile) is not None and backend.objective is not None:
                self.compile_report = dict(backend.objective.describe())
            graphs = backend.describe_graphs()
            if graphs is not None:
                self.compile_report = graphs
