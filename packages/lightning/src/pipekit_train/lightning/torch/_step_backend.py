"""`TorchStepBackend`: plain-torch train/eval steps on core's run loop.

It is the step backend of `Torch()` (driven by core's `run_step_loop`) and of
`OnlineTrainer` on the Lightning backend; no Lightning is involved. An update is what
a hand-written torch loop does — `zero_grad`, forward and loss, `backward`, clip,
`optimizer.step()`, `scheduler.step()` — with, where the plan asks for them, gradient
accumulation (each of `m` batches' loss divided by `m`), autocast and a grad scaler
(`_amp.py`) and the non-finite skip. `train_steps` runs K such updates in one call
(fused steps): the losses stay on the device, stacked, and core fetches them when it
logs. The per-step Python around the torch calls is kept to what the hand loop has:
gradients are reset by assignment over a parameter list gathered once (`_grads.py`,
what `zero_grad(set_to_none=True)` does, without its profiler range), core's
`mse`/`mae`/`huber` call their ATen kernels directly (`_losses.py`), and a fused
group's stacked batch is split with one `unbind` per key.

Dropout and other random layers draw from a private torch CPU RNG state carried in the
training state (the caller's global RNG is left alone), so it checkpoints and resumes
exactly with the model, optimizer, schedule and grad scaler. The state is swapped in
around each call only when the model may draw random numbers (`_determinism.py`: any
module outside a list of torch layers known not to).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from pipekit_train.core.adapter import (
    GRAD_NORM,
    DirectoryCheckpointer,
    Plan,
    StepBackend,
    adjusts_learning_rate,
    evaluates_as_rollout,
    prefetch_depth,
)
from pipekit_train.lightning._checkpoint import checkpointer
from pipekit_train.lightning._data import native_batches, native_eval_batches
from pipekit_train.lightning._ema import averaged_copy, has_ema, swapped_in
from pipekit_train.lightning._fetch import fetch
from pipekit_train.lightning._grad_norm import grad_norm
from pipekit_train.lightning._losses import torch_loss
from pipekit_train.lightning._lr_scale import apply_lr_scale
from pipekit_train.lightning._model import TorchModelOp, as_input, module_dtype
from pipekit_train.lightning._optim import build_optimizer, gradient_clip
from pipekit_train.lightning._rollout import UPDATES, RolloutLoss
from pipekit_train.lightning._state import TrainState, derive_seed

from ._amp import amp_for
from ._compile import CUDA_GRAPHS, Objective
from ._determinism import is_deterministic
from ._distributed import DataParallel
from ._grads import GradReset
from ._graphs import GraphedUpdate

__all__ = ["TorchStepBackend"]


class TorchStepBackend(StepBackend[TrainState]):
    """Core's `StepBackend` protocol in plain torch (see the module docs).

    Args:
        plan: the plan (`OnlineTrainer`'s or a `TrainingLoop`'s).
        steps_per_execution: the most updates one `train_steps` call runs.
        precision: a core precision name (`"float32"`, `"bfloat16-mixed"`,
            `"float16-mixed"`).
        compile: False, or `torch.compile` options for the forward-and-loss function
            (see `Torch`).
        fused_optimizer: build the optimizer with torch's fused kernel where it has one.
        device: where to train (None: where the model's parameters are).
    """

    name = "torch"

    def __init__(
        self,
        plan: Plan,
        *,
        steps_per_execution: int = 1,
        precision: str = "float32",
        compile: Any = False,
        fused_optimizer: bool = False,
        device: Any = None,
    ):
        self.plan = plan
        model = plan.model
        if isinstance(model, TorchModelOp):
            self._op = model
        else:
            assert isinstance(model, torch.nn.Module)  # the adapter's validate() checked it
            self._op = TorchModelOp.wrap(model, seed=plan.seed)
        self._loss = torch_loss(plan.loss)
        self._rollout = RolloutLoss.of(plan, self._loss)
        self._clip = gradient_clip(plan.optimizer_config)
        self._dtype, self._home = module_dtype(self._op.model)
        self._device = self._home if device is None else torch.device(device)
        self._amp = amp_for(precision)
        self._micro = int(plan.accumulate_grad_batches)
        self._skip = plan.on_nonfinite == "skip"
        self._grad_norm = bool(plan.log_grad_norm)
        self._norm: Any = None  # the latest update's gradient norm (log_grad_norm)
        self._fused = bool(fused_optimizer)
        self._compile = compile
        self._cuda = self._device.type == "cuda"
        self._graphs = compile == CUDA_GRAPHS  # the whole update as a CUDA graph
        self._graphed: GraphedUpdate | None = None
        self.steps_per_execution = max(1, int(steps_per_execution))
        # on CUDA a thread copies the next batches to the device while the step runs,
        # when they are large enough to pay (`prefetch_depth`)
        self.prefetch = prefetch_depth(plan, self.steps_per_execution) if self._cuda else 0
        self.objective: Objective | None = None
        self._zero_grad = GradReset()
        # the private RNG is swapped in only around modules that may draw from it
        self._random = not is_deterministic(self._op.model)
        # data parallel over an initialized process group (`_distributed.py`)
        self._dp = DataParallel(self._device) if DataParallel.joined() else None
        if self._dp is not None:
            self.data_shard = (self._dp.rank, self._dp.world)
            self.is_chief = self._dp.rank == 0

    # -- state -----------------------------------------------------------------------------
    def init_state(self) -> TrainState:
        """A copy of the model on the device, a fresh optimizer (and schedule), a seeded RNG."""
        net = copy.deepcopy(self._op.model).to(self._device)
        net.train()
        if self._dp is not None:
            self._dp.broadcast(net)
        optimizer, scheduler = build_optimizer(
            self.plan.optimizer_config,
            net.parameters(),
            total_steps=self.plan.total_steps,
            fused=self._fused,
            lr_scale=adjusts_learning_rate(self.plan),
            capturable=self._graphs,
        )
        self._graphed = None  # captured again for this state (after a restore, too)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.plan.seed, 0, 1))
            rng = torch.get_rng_state()
        self.objective = Objective(net, self._loss, self._amp, self._device, self._compile)
        return TrainState(
            net,
            [optimizer],
            [] if scheduler is None else [scheduler],
            torch_rng=rng,
            scaler=self._amp.scaler(self._device),
        )

    # -- data ------------------------------------------------------------------------------
    def put(self, batch: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """A numpy batch (or K stacked ones) as tensors on the device, zero-copy on CPU.

        Floating arrays take the model's dtype; on CUDA the host tensor is pinned and
        copied without blocking.
        """
        out: dict[str, Any] = {}
        for key, value in batch.items():
            if type(value) is np.ndarray and value.flags.writeable:
                t = torch.from_numpy(value)
            elif isinstance(value, torch.Tensor):
                t = value
            else:
                out[key] = as_input(value, self._dtype, self._device)
                continue
            if t.is_floating_point() and t.dtype != self._dtype:
                t = t.to(self._dtype)
            if self._cuda and t.device.type == "cpu":
                t = t.pin_memory().to(self._device, non_blocking=True)
            elif t.device != self._device:
                t = t.to(self._device)
            out[key] = t
        return out

    def native_batches(
        self, data: Any, data_state: Mapping[str, Any] | None
    ) -> Iterator[Mapping[str, np.ndarray]]:
        """Endless batches of a torch `DataLoader` (epoch after epoch)."""
        return native_batches(data)

    def native_eval_batches(self, data: Any) -> Iterator[Mapping[str, np.ndarray]]:
        """One pass over a torch `DataLoader`."""
        return native_eval_batches(data)

    # -- steps -----------------------------------------------------------------------------
    def _next_update(self, state: TrainState) -> int:
        """The number of the update about to run (0-based), counted in the state."""
        update = int(state.extra.get(UPDATES, 0))
        state.extra[UPDATES] = update + 1
        return update

    def _rollout_objective(self, state: TrainState, update: int) -> Any:
        """`batch -> loss` of rollout training at `update` (the model under autocast)."""
        rollout, net, amp, device = self._rollout, state.module, self._amp, self._device
        assert rollout is not None

        def model_fn(x: Any) -> Any:
            if amp.dtype is None:
                return net(x)
            with torch.autocast(device_type=device.type, dtype=amp.dtype):
                return net(x)

        return lambda batch: rollout.train_loss(model_fn, batch, update)

    def _objective(self, state: TrainState) -> Any:
        """`batch -> loss` of the update about to run."""
        if self._rollout is not None:
            return self._rollout_objective(state, self._next_update(state))
        objective = self.objective
        assert objective is not None  # set per run (eager or compiled)
        return lambda batch: objective(batch["x"], batch["y"])

    def _plain_update(self, state: TrainState, batch: Mapping[str, Any]) -> Any:
        """The update of a hand-written loop (one batch, no scaler, no skip); its loss."""
        optimizer = state.optimizers[0]
        self._zero_grad(optimizer)
        if self._rollout is None:
            loss = self.objective(batch["x"], batch["y"])  # type: ignore[misc]  # objective is set per run (eager or compiled)
        else:
            loss = self._objective(state)(batch)
        loss.backward()
        if self._dp is not None:
            (loss,) = self._dp.average(state.module, (loss,))
        self._norm = self._clip_grads(state.module)
        optimizer.step()
        for scheduler in state.schedulers:
            scheduler.step()
        return loss.detach()

    def _clip_grads(self, net: torch.nn.Module) -> Any:
        """Clip as the plan says; the gradient's global norm before clipping when
        `log_grad_norm` is on (`clip_grad_norm_` computes it anyway), else None."""
        norm = None
        if self._clip is not None and self._clip[1] == "norm":
            norm = torch.nn.utils.clip_grad_norm_(net.parameters(), self._clip[0])
        elif self._grad_norm:
            norm = grad_norm(net)
        if self._clip is not None and self._clip[1] != "norm":
            torch.nn.utils.clip_grad_value_(net.parameters(), self._clip[0])
        return norm.detach() if self._grad_norm and norm is not None else None

    def _update(self, state: TrainState, batches: Sequence[Mapping[str, Any]]) -> list[Any]:
        """One optimizer update from `len(batches)` accumulated batches; their losses."""
        net, optimizer, scaler = state.module, state.optimizers[0], state.scaler
        m = len(batches)
        if self._dp is not None and self._random:
            self._dp.reseed(state)  # this process's stream for this update
        if m == 1 and scaler is None and not self._skip:
            return [self._plain_update(state, batches[0])]
        objective = self._objective(state)
        saved = None
        if self._skip:
            buffers = [b for b in net.buffers() if b.is_floating_point()]
            if buffers:
                with torch.no_grad():
                    saved = (buffers, [b.clone() for b in buffers])
        self._zero_grad(optimizer)
        losses = []
        for batch in batches:
            loss = objective(batch)
            scaled = loss / m if m > 1 else loss
            if scaler is not None:
                scaled = scaler.scale(scaled)
            scaled.backward()
            losses.append(loss.detach())
        if self._dp is not None:  # every process now sees the same gradients and losses
            losses = self._dp.average(net, losses)
        if self._grad_norm:  # a dropped update reports NaN
            self._norm = torch.full((), float("nan"), device=losses[0].device)
        if self._skip and not all(bool(torch.isfinite(v)) for v in losses):
            # on_nonfinite="skip": parameters, optimizer state, schedule and buffers stay
            self._zero_grad(optimizer)
            if saved is not None:
                with torch.no_grad():
                    for buffer, before in zip(*saved, strict=True):
                        buffer.copy_(before)
            return losses
        if scaler is not None:
            scaler.unscale_(optimizer)
        self._norm = self._clip_grads(net)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        for scheduler in state.schedulers:
            scheduler.step()
        return losses

    def _enter_rng(self, state: TrainState) -> torch.Tensor | None:
        if state.torch_rng is None or not self._random:
            return None
        outer = torch.get_rng_state()
        if self._dp is None:  # data parallel: each update seeds its own (`_update`)
            torch.set_rng_state(state.torch_rng)
        return outer

    def _leave_rng(self, state: TrainState, outer: torch.Tensor | None) -> None:
        if outer is not None:
            if self._dp is None:
                state.torch_rng = torch.get_rng_state()
            torch.set_rng_state(outer)

    def _graph(self, state: TrainState) -> GraphedUpdate:
        """The whole-update CUDA graph of this run's state (built at its first update)."""
        if self._graphed is None:
            self._graphed = GraphedUpdate(
                net=state.module,
                optimizer=state.optimizers[0],
                schedulers=state.schedulers,
                loss=self._loss,
                autocast_dtype=self._amp.dtype,
                clip=self._clip_grads,
                device=self._device,
            )
        return self._graphed

    def describe_graphs(self) -> dict[str, Any] | None:
        """What the CUDA graph did (`GraphedUpdate.describe`), or None without one."""
        return None if self._graphed is None else self._graphed.describe()

    def train_step(
        self, state: TrainState, batch: Mapping[str, Any]
    ) -> tuple[TrainState, dict[str, Any]]:
        """One optimizer update; the loss stays a tensor."""
        if self._graphs:
            losses, self._norm = self._graph(state)((batch,))
            return state, self._metrics(losses[0])
        if not self._random and state.scaler is None and not self._skip:
            return state, self._metrics(self._plain_update(state, batch))
        outer = self._enter_rng(state)
        try:
            losses = self._update(state, (batch,))
        finally:
            self._leave_rng(state, outer)
        return state, self._metrics(losses[0])

    def _metrics(self, loss: Any) -> dict[str, Any]:
        if not self._grad_norm:
            return {"loss": loss}
        return {"loss": loss, GRAD_NORM: self._norm}

    @staticmethod
    def _rows(stacked: Mapping[str, Any], n: int) -> list[dict[str, Any]]:
        """The `n` batches of a stacked group, as views."""
        keys = list(stacked)
        if all(isinstance(stacked[key], torch.Tensor) for key in keys):
            # one unbind per key: n views, without n indexing calls per key
            columns = [stacked[key].unbind(0) for key in keys]
            return [dict(zip(keys, values, strict=True)) for values in zip(*columns, strict=True)]
        return [{key: value[i] for key, value in stacked.items()} for i in range(n)]

    def stack(self, batches: Sequence[Any]) -> list[Any]:
        """Batches prefetched one by one to the device: `train_steps` takes them as a list
        (no stacking needed: each update reads its own batches)."""
        return list(batches)

    def train_steps(
        self, state: TrainState, stacked: Mapping[str, Any] | list[Any]
    ) -> tuple[TrainState, dict[str, Any]]:
        """K updates over `K * m` stacked batches (`m`: accumulation), in one call.

        The loss of every batch stays on the device, stacked (shape `(K * m,)`).
        """
        m = self._micro
        if isinstance(stacked, list):  # batches prefetched one by one (`stack`)
            rows = stacked
            n = len(rows)
        else:
            n = int(stacked["x"].shape[0])
            rows = self._rows(stacked, n)
        losses: list[Any] = []
        norms: list[Any] = []
        if self._graphs:
            graph = self._graph(state)
            for start in range(0, n, m):
                group, self._norm = graph(rows[start : start + m])
                losses += group
                norms.append(self._norm)
        else:
            outer = self._enter_rng(state)
            try:
                for start in range(0, n, m):
                    losses += self._update(state, rows[start : start + m])
                    norms.append(self._norm)
            finally:
                self._leave_rng(state, outer)
        if not self._grad_norm:
            return state, {"loss": torch.stack(losses)}
        # one norm per update (core takes a per-step metric as it is)
        return state, {"loss": torch.stack(losses), GRAD_NORM: torch.stack(norms)}

    def eval_batch(
        self, state: TrainState, batch: Mapping[str, np.ndarray]
    ) -> tuple[np.ndarray, float]:
        """`(predictions, mean loss)` in eval mode without autograd (autocast as in training).

        With `optimizer_config["ema"]` the module holds the moving average meanwhile.
        """
        net = state.module
        was = net.training
        net.eval()
        try:
            with swapped_in(state.optimizers), torch.no_grad(), self._amp.autocast(self._device):
                inputs = self.put(batch)
                if self._rollout is not None and evaluates_as_rollout(
                    inputs, self._rollout.rollout
                ):  # windows: the longest rollout, without noise; pairs: one application
                    pred, value = self._rollout.eval_loss(net, inputs)
                    loss = float(value)
                else:
                    pred = net(inputs["x"])
                    loss = float(self._loss(pred, inputs["y"]))
        finally:
            net.train(was)
        out = pred.detach()
        if out.dtype in (torch.bfloat16, torch.float16):
            out = out.float()
        return out.cpu().numpy(), loss

    def with_lr_scale(self, state: TrainState, scale: float) -> TrainState:
        """Core's learning-rate scale into the schedule's base rates (`apply_lr_scale`)."""
        apply_lr_scale(state.optimizers, state.schedulers, scale)
        return state

    def learning_rate(self, state: TrainState) -> float:
        """The first parameter group's learning rate."""
        return float(state.optimizers[0].param_groups[0]["lr"])

    def agree(self, flags: Sequence[bool]) -> Sequence[bool]:
        """Element-wise "any process" of the step-boundary flags (data parallel runs)."""
        return flags if self._dp is None else self._dp.any(flags)

    def fetch(self, values: Any) -> list[np.ndarray]:
        """Tensors to host arrays in one transfer."""
        return fetch(values)

    def model_op(self, state: TrainState) -> TorchModelOp:
        """An independent operator holding a copy of the current module (where it came from).

        With `optimizer_config["ema"]` the copy holds the moving average of the weights.
        """
        net = averaged_copy(state.module, state.optimizers) or copy.deepcopy(state.module)
        return self._op.with_model(net.to(self._home).eval())

    def raw_model_op(self, state: TrainState) -> TorchModelOp | None:
        """The operator with the trained weights when `model_op` holds the average."""
        if not has_ema(state.optimizers):
            return None
        return self._op.with_model(copy.deepcopy(state.module).to(self._home).eval())

    # -- checkpoints -----------------------------------------------------------------------
    def checkpointer(self) -> DirectoryCheckpointer:
        """Core's atomic directory store with the torch encoding (grad scaler included).

        The training thread only copies the tensors into host buffers reused from one
        save to the next; encoding, hashing and writing run on the writer thread.
        """
        assert self.plan.checkpoint is not None
        return checkpointer(self.plan.checkpoint)
