"""Data parallel `Torch()`: one run over `torch.distributed`'s default process group.

When the process group is initialized with more than one process (Ray Train's
`TorchTrainer`, or the user's own `init_process_group` under `torchrun`), every process
holds a full replica of the model and trains on its part of each global batch (core
shards the dataset: `StepBackend.data_shard`). `DataParallel` is what the step backend
adds to a single-process update:

- `broadcast`: the replicas start from process 0's weights and buffers, as
  `DistributedDataParallel` does at wrap time.
- `average`: after `backward`, one all-reduce of the gradients, each divided by the
  number of processes first (what DDP's default reducer does), together with the
  batches' losses, so that every process logs, clips, skips a non-finite update and
  steps on the same numbers and the replicas stay bit-identical.
- `any`: the step-boundary vote of core's lifecycle (stop, preemption, time budget).
- `reseed`: random layers draw from a stream per process and update, derived from the
  one private RNG state the processes share (and the chief checkpoints), so that
  dropout differs between processes and a resume is exact with no per-process state.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from pipekit_train.lightning._state import TrainState, derive_seed

__all__ = ["DataParallel", "launched_world_size"]


def launched_world_size() -> int:
    """`WORLD_SIZE` as a launcher (torchrun, SLURM via Lightning) set it, or 1."""
    world = os.environ.get("WORLD_SIZE", "1")
    return int(world) if world.isdigit() else 1


class DataParallel:
    """The default process group's rank, size and the collectives one update needs.

    Args:
        device: the training device (the vote's tensor lives there under nccl).
    """

    def __init__(self, device: torch.device):
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self._device = device if dist.get_backend() == "nccl" else torch.device("cpu")

    @staticmethod
    def joined() -> bool:
        """Whether this process is one of several in an initialized process group."""
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    def broadcast(self, net: torch.nn.Module) -> None:
        """Process 0's parameters and buffers into every replica."""
        with torch.no_grad():
            for tensor in [*net.parameters(), *net.buffers()]:
                dist.broadcast(tensor.data, src=0)

    def average(self, net: torch.nn.Module, losses: Sequence[torch.Tensor]) -> list[Any]:
        """Average the gradients (in place) and `losses` over the processes.

        One all-reduce per gradient dtype; the losses travel with the first group.

        Returns:
            The losses averaged over the processes (detached).
        """
        groups: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in net.parameters():
            if p.grad is not None:
                groups.setdefault(p.grad.dtype, []).append(p.grad)
        stacked = torch.stack([v.detach().reshape(()) for v in losses])
        buckets = list(groups.values()) or [[]]
        mean: list[Any] = []
        for i, grads in enumerate(buckets):
            parts = [g.reshape(-1) for g in grads]
            if i == 0:  # the losses ride with the first bucket, in its dtype
                parts.append(stacked.to(grads[0].dtype) if grads else stacked)
            flat = torch.cat(parts)
            flat.div_(self.world)
            dist.all_reduce(flat)
            offset = 0
            for g in grads:
                n = g.numel()
                g.copy_(flat[offset : offset + n].view_as(g))
                offset += n
            if i == 0:
                mean = list(flat[offset:].to(stacked.dtype).unbind(0))
        return mean

    def any(self, flags: Sequence[bool]) -> list[bool]:
        """Element-wise "any process" of `flags`."""
        vote = torch.tensor([int(bool(f)) for f in flags], dtype=torch.int32, device=self._device)
        dist.all_reduce(vote, op=dist.ReduceOp.MAX)
        return [bool(v) for v in vote.tolist()]

    def reseed(self, state: TrainState) -> None:
        """Seed torch's global CPU RNG for this process's next update.

        One draw from the shared private state (the same on every process, which it
        advances) picks the update's seed; each process then derives its own stream.
        """
        assert state.torch_rng is not None
        torch.set_rng_state(state.torch_rng)
        seed = int(torch.randint(0, 2**62, (1,)).item())
        state.torch_rng = torch.get_rng_state()
        torch.manual_seed(derive_seed(seed, self.rank + 1))
