"""Training state of the torch backends and its checkpoint encoding.

`TorchState` holds live objects (module, optimizers, schedulers) plus the RNG record
captured at save time. `snapshot_state` copies its tensors into reused host buffers on
the training thread and `encode_snapshot` turns that into named byte blobs on core's
`DirectoryCheckpointer` writer thread (safetensors for tensors, JSON for the rest; no
pickle); `encode_state` does both at once;
`decode_state` parses a step's blobs completely before touching the template, then
loads the model weights and whatever optimizer/scheduler objects exist, keeping the
rest as `pending` for objects created later (Lightning builds optimizers inside
`Trainer.fit`).
"""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from pipekit_train.core import Checkpoint
from pipekit_train.core.adapter import DirectoryCheckpointer

from ._model import load_module_weights
from ._weights import (
    decode_optimizer,
    decode_state_dict,
    decode_tensors,
    encode_json_tree,
    encode_tensors,
    snapshot_tensors,
    to_json_tree,
)

__all__ = [
    "TorchState",
    "capture_rng",
    "checkpointer",
    "decode_state",
    "derive_seed",
    "encode_snapshot",
    "encode_state",
    "fetch",
    "restore_rng",
    "seed_rng",
    "snapshot_state",
]

MODEL = "model.safetensors"
RNG = "rng.json"
PRIVATE_RNG = "torch_rng.safetensors"
EXTRA = "extra.json"


@dataclass
class TorchState:
    """Live training state: module, optimizers, schedulers, RNG record, extra JSON.

    Attributes:
        module: the module whose state dict is checkpointed.
        optimizers: the optimizers (possibly empty before Lightning builds them).
        schedulers: the learning-rate schedulers.
        rng: RNG records to save (one per process), captured just before a save.
        extra: small JSON state (e.g. a grad scaler's).
        pending: restored optimizer/scheduler/RNG state not yet applied.
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


# -- checkpoint blobs -----------------------------------------------------------------------
def snapshot_state(state: TorchState, buffers: dict[str, torch.Tensor]) -> list[tuple[str, Any]]:
    """Training thread: `(blob name, part)` pairs with every tensor copied into `buffers`.

    A part is bytes (small JSON, ready now), a dict of host tensors (encoded later with
    `encode_tensors`) or a `to_json_tree` tree (dumped later). `encode_snapshot` turns the
    pairs into the blobs `encode_state` would have given for the state at this moment.
    """
    parts: list[tuple[str, Any]] = [
        (MODEL, snapshot_tensors(state.module.state_dict(), buffers, f"{MODEL}/"))
    ]
    for kind, objs in (("optimizer", state.optimizers), ("scheduler", state.schedulers)):
        for i, obj in enumerate(objs):
            tensors: dict[str, torch.Tensor] = {}
            tree = to_json_tree(dict(obj.state_dict()), tensors, "s")
            name = f"{kind}.{i}"
            parts.append((f"{name}.safetensors", snapshot_tensors(tensors, buffers, f"{name}/")))
            parts.append((f"{name}.json", ("tree", tree)))
    if state.rng is not None:
        parts.append((RNG, json.dumps(state.rng, sort_keys=True).encode()))
    if state.torch_rng is not None:
        parts.append((PRIVATE_RNG, encode_tensors({"state": state.torch_rng})))
    parts.append((EXTRA, json.dumps(state.extra, sort_keys=True).encode()))
    return parts


def encode_snapshot(parts: list[tuple[str, Any]]) -> dict[str, bytes]:
    """Writer thread: the named blobs of a `snapshot_state` result."""
    blobs: dict[str, bytes] = {}
    for name, part in parts:
        if isinstance(part, bytes):
            blobs[name] = part
        elif isinstance(part, tuple):
            blobs[name] = encode_json_tree(part[1])
        else:
            blobs[name] = encode_tensors(part)
    return blobs


def encode_state(state: TorchState) -> dict[str, bytes]:
    """Snapshot a `TorchState` into named blobs (on the calling thread)."""
    return encode_snapshot(snapshot_state(state, {}))


def _indexed(blobs: Mapping[str, bytes], kind: str) -> list[dict[str, Any]]:
    out = []
    i = 0
    while f"{kind}.{i}.json" in blobs:
        out.append(decode_optimizer(blobs[f"{kind}.{i}.safetensors"], blobs[f"{kind}.{i}.json"]))
        i += 1
    return out


def decode_state(blobs: Mapping[str, bytes], template: TorchState) -> TorchState:
    """Load a step's blobs into `template` (see the module docs) and return it.

    Raises:
        ValueError: a blob is malformed or does not fit the template (the step is then
            treated as torn by the checkpointer, and the template is left untouched).
    """
    if MODEL not in blobs:
        raise ValueError(f"the checkpoint has no {MODEL}")
    weights = decode_state_dict(blobs[MODEL])
    optimizers = _indexed(blobs, "optimizer")
    schedulers = _indexed(blobs, "scheduler")
    rng = json.loads(blobs[RNG].decode()) if RNG in blobs else None
    extra = json.loads(blobs[EXTRA].decode()) if EXTRA in blobs else {}
    private = decode_tensors(blobs[PRIVATE_RNG])[0]["state"] if PRIVATE_RNG in blobs else None
    if template.torch_rng is not None and private is None:
        raise ValueError(f"the checkpoint has no {PRIVATE_RNG}")
    current = template.module.state_dict()
    if set(weights) != set(current):
        raise ValueError(
            f"the checkpoint's parameters {sorted(weights)[:6]} do not match the model's {sorted(current)[:6]}"
        )
    for name, ref in current.items():
        if tuple(weights[name].shape) != tuple(ref.shape):
            raise ValueError(
                f"`{name}` has shape {list(weights[name].shape)}, the model {list(ref.shape)}"
            )
    if template.optimizers and len(optimizers) != len(template.optimizers):
        raise ValueError(
            f"the checkpoint holds {len(optimizers)} optimizer states, the run has {len(template.optimizers)}"
        )
    load_module_weights(template.module, weights)
    template.pending = {"optimizers": optimizers, "schedulers": schedulers}
    template.rng = rng
    template.extra = extra
    if template.torch_rng is not None:
        template.torch_rng = private
    if template.optimizers:
        template.apply_pending()
    return template


def checkpointer(policy: Checkpoint) -> DirectoryCheckpointer:
    """Core's atomic directory store with the torch encoding.

    The training thread only copies the tensors into host buffers reused from one save to
    the next (`snapshot_state`); encoding, hashing and writing run on the writer thread.
    """
    buffers: dict[str, torch.Tensor] = {}
    return DirectoryCheckpointer(
        policy,
        snapshot=lambda state: snapshot_state(state, buffers),
        encode=encode_snapshot,
        decode=decode_state,
    )


def fetch(values: Sequence[Any]) -> list[np.ndarray]:
    """Device scalars to host arrays in one transfer (stacked when they are alike)."""
    if not values:
        return []
    if all(type(v) is torch.Tensor and v.ndim == 0 for v in values):
        try:
            with torch.no_grad():
                stacked = torch.stack(list(values))
        except (RuntimeError, TypeError):  # mixed dtypes or devices
            pass
        else:
            if stacked.dtype in (torch.bfloat16, torch.float16):
                stacked = stacked.float()
            return list(stacked.cpu().numpy())
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            v = v.detach()
            if v.dtype in (torch.bfloat16, torch.float16):
                v = v.float()
            v = v.cpu().numpy()
        out.append(np.asarray(v))
    return out
