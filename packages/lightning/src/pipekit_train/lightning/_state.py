"""The train state a torch checkpoint holds, and the RNG records that go with it.

`TrainState` holds live objects (module, optimizers, schedulers) plus the RNG records
captured at save time and small JSON state (`extra`); restored optimizer/scheduler state
waits in `pending` until the objects exist (Lightning builds optimizers inside
`Trainer.fit`). `capture_rng` / `restore_rng` turn the global torch, CUDA, numpy and
python RNG states into JSON and back; `derive_seed` / `seed_rng` seed a fresh process.
"""

from __future__ import annotations

import base64
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = ["TrainState", "capture_rng", "derive_seed", "restore_rng", "seed_rng"]


@dataclass
class TrainState:
    """Live training state: module, optimizers, schedulers, RNG record, extra JSON.

    Attributes:
        module: the module whose state dict is checkpointed.
        optimizers: the optimizers (possibly empty before Lightning builds them).
        schedulers: the learning-rate schedulers.
        rng: RNG records to save (one per process), captured just before a save.
        extra: small JSON state (e.g. a grad scaler's).
        pending: restored optimizer/scheduler state not yet applied.
        torch_rng: a private torch CPU RNG state (the step backend's), or None.
        scaler: the `torch.amp.GradScaler` of a float16-mixed step backend, or None (its
            state travels in `extra`).
    """

    module: torch.nn.Module
    optimizers: list[Any] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)
    rng: list[dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    pending: dict[str, Any] = field(default_factory=dict)
    torch_rng: torch.Tensor | None = None
    scaler: Any = None

    def apply_pending(self) -> None:
        """Load pending optimizer/scheduler state into the objects that now exist."""
        opts = self.pending.pop("optimizers", None)
        if opts is not None:
            if len(opts) != len(self.optimizers):
                raise ValueError(
                    f"the checkpoint holds {len(opts)} optimizer states, the run has {len(self.optimizers)}"
                )
            for opt, sd in zip(self.optimizers, opts, strict=True):
                opt.load_state_dict(sd)
        scheds = self.pending.pop("schedulers", None)
        if scheds is not None:
            if len(scheds) != len(self.schedulers):
                raise ValueError(
                    f"the checkpoint holds {len(scheds)} scheduler states, the run has {len(self.schedulers)}"
                )
            for sched, sd in zip(self.schedulers, scheds, strict=True):
                sched.load_state_dict(sd)


# -- RNG ----------------------------------------------------------------------------------
def derive_seed(seed: int, rank: int = 0, stream: int = 0) -> int:
    """A 63-bit seed for `(seed, rank, stream)` (rank 0, stream 0 gives `seed` itself)."""
    if rank == 0 and stream == 0:
        return int(seed)
    ss = np.random.SeedSequence([int(seed), int(rank), int(stream)])
    return int(ss.generate_state(2, np.uint64)[0] >> np.uint64(1))


def seed_rng(seed: int) -> None:
    """Seed the global torch, numpy and python RNGs."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def capture_rng(device: torch.device | None = None) -> dict[str, Any]:
    """The global RNG states (torch CPU, the CUDA device's, numpy, python) as JSON."""
    np_state: Any = np.random.get_state()  # the legacy tuple (numpy types it as a union)
    py_state = random.getstate()
    record: dict[str, Any] = {
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
        "numpy": {
            "keys": np.asarray(np_state[1]).tolist(),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "python": [py_state[0], list(py_state[1]), py_state[2]],
    }
    if device is not None and device.type == "cuda":
        record["cuda"] = base64.b64encode(
            torch.cuda.get_rng_state(device).numpy().tobytes()
        ).decode()
    return record


def restore_rng(record: Mapping[str, Any], device: torch.device | None = None) -> None:
    """Inverse of `capture_rng`."""
    torch.set_rng_state(
        torch.frombuffer(bytearray(base64.b64decode(record["torch"])), dtype=torch.uint8)
    )
    npr = record["numpy"]
    np.random.set_state(
        (
            "MT19937",
            np.asarray(npr["keys"], dtype=np.uint32),
            npr["pos"],
            npr["has_gauss"],
            npr["cached_gaussian"],
        )
    )
    py = record["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    if "cuda" in record and device is not None and device.type == "cuda":
        state = torch.frombuffer(bytearray(base64.b64decode(record["cuda"])), dtype=torch.uint8)
        torch.cuda.set_rng_state(state, device)
