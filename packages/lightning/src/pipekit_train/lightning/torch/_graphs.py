"""Whole-update CUDA graphs: `Torch(compile="cuda-graphs")`.

An eager torch update on a small model is bound by kernel launches: forward, loss,
backward, clipping and the optimizer step are a few hundred kernels, each launched from
Python. `GraphedUpdate` captures one whole optimizer update — forward and loss under the
step's autocast, backward (with gradient accumulation: `m` forward/backward passes),
gradient clipping or the gradient's norm, the optimizer step (torch's *capturable*
Adam/AdamW, with the learning rate a device tensor) and the moving average of the
weights — into one `torch.cuda.CUDAGraph`, and replays it: one launch per update.

How a run goes (the pattern of torch's whole-network capture, as in Megatron-Core's and
NeMo's full-iteration graphs):

- the first `warmup` updates run eagerly on a side stream (they are real updates of the
  run, on its batches): they create the optimizer state and the gradients' autograd
  streams;
- the next update is captured: its batch is copied into static input buffers, the
  update is recorded (nothing runs while recording) and then replayed once;
- every later update copies its batch into the static buffers and replays. The losses
  (and the gradient norm) the graph writes are copied out before the next replay
  overwrites them, so the run's metrics can stay on the device until core fetches them.

The learning-rate schedule and core's learning-rate scale stay on the host: after each
replay the scheduler writes the next rate into the device tensor the graph reads
(`fill_`, no synchronisation). A batch of another shape than the captured one (a last
partial batch) runs eagerly. If the capture fails, the run warns
(`CompileFallbackWarning`) and continues eagerly from that update: the capture executes
nothing, so the numbers are the eager ones.

Exact resume: the eager updates and the replays run the same kernels, so a run resumed
from a checkpoint (which warms up and captures again) ends with the same weights as an
uninterrupted graphed run on the same GPU. A graphed run is not bit-identical to an
eager `Torch()` run: the capturable optimizer computes its bias corrections on the
device, in float32.

What cannot be captured is refused before the run (`Torch.validate`): a loss check on the
host each step (`on_nonfinite="skip"`), float16 loss scaling (`GradScaler` checks for
infinities on the host), an optimizer without a capturable torch implementation, a
model that draws random numbers (its CUDA RNG state is not checkpointed), torch's fused
optimizer kernels (`fused_optimizer=True`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ._compile import CompileFallbackWarning

__all__ = ["CAPTURABLE_OPTIMIZERS", "GraphedUpdate", "tensor_learning_rates"]

CAPTURABLE_OPTIMIZERS = ("adam", "adamw")
"""Core optimizer names whose torch implementation runs inside a CUDA graph
(`capturable=True`, the learning rate a device tensor)."""


def tensor_learning_rates(optimizer: Any, device: torch.device) -> None:
    """Make every parameter group's learning rate a 0-d float32 tensor on `device`.

    A captured optimizer step reads the rate from that tensor, so the host can change it
    between replays; a checkpoint restored from the host puts a number or a CPU tensor
    there, which this turns back into the device tensor (the value kept).
    """
    for group in optimizer.param_groups:
        lr = group["lr"]
        if isinstance(lr, torch.Tensor) and lr.device == device and lr.dtype == torch.float32:
            continue
        group["lr"] = torch.tensor(float(lr), dtype=torch.float32, device=device)


class GraphedUpdate:
    """One optimizer update, captured once and replayed (see the module docs).

    Args:
        net: the module being trained (on a CUDA device).
        optimizer: its optimizer (a capturable torch optimizer).
        schedulers: the learning-rate schedulers, stepped on the host after each update.
        loss: `loss(pred, target) -> scalar tensor`.
        autocast_dtype: the autocast dtype of forward and loss, or None (float32).
        clip: `(net) -> norm or None`: clips the gradient as the plan says and returns
            the gradient's norm when the run records it.
        device: the CUDA device.
        warmup: eager updates before the capture.
    """

    def __init__(
        self,
        *,
        net: torch.nn.Module,
        optimizer: Any,
        schedulers: Sequence[Any],
        loss: Callable[[Any, Any], Any],
        autocast_dtype: torch.dtype | None,
        clip: Callable[[torch.nn.Module], Any],
        device: torch.device,
        warmup: int = 3,
    ):
        self._net = net
        self._optimizer = optimizer
        self._schedulers = list(schedulers)
        self._loss = loss
        self._dtype = autocast_dtype
        self._clip = clip
        self._device = device
        self._warmup_left = max(1, int(warmup))
        self._side = torch.cuda.Stream(device=device)
        self._graph: torch.cuda.CUDAGraph | None = None
        self._static: list[dict[str, torch.Tensor]] = []
        self._shapes: tuple[Any, ...] | None = None
        self._out_losses: list[torch.Tensor] = []
        self._out_norm: torch.Tensor | None = None
        self.updates = 0
        self.captured_at: int | None = None
        self.eager_updates = 0
        self.fell_back: str | None = None
        tensor_learning_rates(optimizer, device)
        self._rates = [group["lr"] for group in optimizer.param_groups]

    # -- the update, as recorded and as run eagerly ----------------------------------------------
    def _forward_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self._dtype is None:
            return self._loss(self._net(x), y)
        # no autocast cache: cached casts would live in (and be freed from) the graph's pool
        with torch.autocast(self._device.type, dtype=self._dtype, cache_enabled=False):
            return self._loss(self._net(x), y)

    def _record(self, batches: Sequence[Mapping[str, torch.Tensor]]) -> tuple[list[Any], Any]:
        """Forward and backward of every batch, clip, optimizer step (the captured part)."""
        m = len(batches)
        losses = []
        for batch in batches:
            loss = self._forward_loss(batch["x"], batch["y"])
            (loss / m if m > 1 else loss).backward()
            losses.append(loss.detach())
        norm = self._clip(self._net)
        self._optimizer.step()
        return losses, norm

    def _step_schedules(self) -> None:
        for scheduler in self._schedulers:
            scheduler.step()  # torch fills a tensor learning rate in place
        # whatever wrote a number instead (an older torch, a callback), the captured step
        # reads the tensor: put the number there (no synchronisation)
        for group, rate in zip(self._optimizer.param_groups, self._rates, strict=True):
            if group["lr"] is not rate:
                rate.fill_(float(group["lr"]))
                group["lr"] = rate

    def _eager(self, batches: Sequence[Mapping[str, torch.Tensor]]) -> tuple[list[Any], Any]:
        """One update without the graph, on the side stream (as torch's warm-up asks)."""
        side, current = self._side, torch.cuda.current_stream(self._device)
        side.wait_stream(current)  # the batch's copy to the device has landed
        with torch.cuda.stream(side):
            self._optimizer.zero_grad(set_to_none=True)
            losses, norm = self._record(batches)
        current.wait_stream(side)
        for value in (*losses, norm):  # made on the side stream, read on the current one
            if isinstance(value, torch.Tensor):
                value.record_stream(current)
        self._step_schedules()
        self.eager_updates += 1
        return losses, norm

    # -- capture and replay -------------------------------------------------------------------
    @staticmethod
    def _shape_key(batches: Sequence[Mapping[str, torch.Tensor]]) -> tuple[Any, ...]:
        return tuple(
            (key, tuple(t.shape), t.dtype) for batch in batches for key, t in sorted(batch.items())
        )

    def _capture(self, batches: Sequence[Mapping[str, torch.Tensor]]) -> None:
        self._static = [{k: torch.empty_like(t) for k, t in b.items()} for b in batches]
        for static, batch in zip(self._static, batches, strict=True):
            for key, t in batch.items():
                static[key].copy_(t)
        torch.cuda.synchronize(self._device)
        self._optimizer.zero_grad(set_to_none=True)  # the backward allocates them in the graph
        graph = torch.cuda.CUDAGraph()
        # thread-local: the prefetching thread may copy the next batches meanwhile
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            losses, norm = self._record(self._static)
        self._graph = graph
        self._out_losses = losses
        self._out_norm = norm
        self._shapes = self._shape_key(batches)
        self.captured_at = self.updates + 1

    def _fall_back(self, exc: BaseException) -> None:
        self.fell_back = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
        self._graph = None
        warnings.warn(
            f"Capturing the update as a CUDA graph failed ({self.fell_back}); training "
            "continues eagerly. Received: compile='cuda-graphs'. Use compile=False to skip "
            "the attempt, or make the step capturable (no host synchronisation in the "
            "model or the loss).",
            CompileFallbackWarning,
            stacklevel=4,
        )

    def __call__(self, batches: Sequence[Mapping[str, torch.Tensor]]) -> tuple[list[Any], Any]:
        """Run one update on `batches` (`m` accumulated ones); `(losses, norm or None)`.

        The returned tensors are the run's own (copies of what the graph wrote).
        """
        self.updates += 1
        if self.fell_back is not None:
            return self._eager(batches)
        if self._graph is None:
            if self._warmup_left > 0:
                self._warmup_left -= 1
                return self._eager(batches)
            try:
                self._capture(batches)
            except Exception as exc:  # nothing was executed: the eager update is exact
                torch.cuda.synchronize(self._device)
                self._fall_back(exc)
                return self._eager(batches)
        elif self._shape_key(batches) != self._shapes:
            return self._eager(batches)  # e.g. a last partial batch
        else:
            for static, batch in zip(self._static, batches, strict=True):
                for key, t in batch.items():
                    static[key].copy_(t, non_blocking=True)
        assert self._graph is not None
        self._graph.replay()
        losses = [v.clone() for v in self._out_losses]
        norm = None if self._out_norm is None else self._out_norm.clone()
        self._step_schedules()
        return losses, norm

    def describe(self) -> dict[str, Any]:
        """`{"cuda_graphs": True, "captured_at_update", "eager_updates", "fell_back"}`."""
        return {
            "cuda_graphs": True,
            "captured_at_update": self.captured_at,
            "eager_updates": self.eager_updates,
            "fell_back": self.fell_back,
        }
