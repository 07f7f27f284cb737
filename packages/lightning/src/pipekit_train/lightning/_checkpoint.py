"""The checkpoint engine of the torch backends: a `TrainState` as named byte blobs.

`snapshot_state` copies the state's tensors into reused host buffers on the training
thread and `encode_snapshot` turns that into named byte blobs on core's
`DirectoryCheckpointer` writer thread (safetensors for tensors, JSON for the rest; no
pickle); `encode_state` does both at once. `decode_state` parses a step's blobs
completely before touching the template, then loads the model weights and whatever
optimizer/scheduler objects exist, keeping the rest as `pending` for objects created
later (Lightning builds optimizers inside `Trainer.fit`). `checkpointer` is the engine
both torch backends save with (a step backend's grad scaler included).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch

from pipekit_train.core.adapter import Checkpoint, DirectoryCheckpointer

from ._model import load_module_weights
from ._state import TrainState
from ._weights import (
    decode_optimizer,
    decode_tensors,
    decode_weights,
    encode_json_tree,
    encode_tensors,
    snapshot_tensors,
    to_json_tree,
)

__all__ = ["checkpointer", "decode_state", "encode_snapshot", "encode_state", "snapshot_state"]

MODEL = "model.safetensors"
RNG = "rng.json"
PRIVATE_RNG = "torch_rng.safetensors"
EXTRA = "extra.json"
SCALER = "grad_scaler"
"""The key of a step backend's grad-scaler state in `TrainState.extra`."""


def snapshot_state(state: TrainState, buffers: dict[str, torch.Tensor]) -> list[tuple[str, Any]]:
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


def encode_state(state: TrainState) -> dict[str, bytes]:
    """Snapshot a `TrainState` into named blobs (on the calling thread)."""
    return encode_snapshot(snapshot_state(state, {}))


def _indexed(blobs: Mapping[str, bytes], kind: str) -> list[dict[str, Any]]:
    out = []
    i = 0
    while f"{kind}.{i}.json" in blobs:
        out.append(decode_optimizer(blobs[f"{kind}.{i}.safetensors"], blobs[f"{kind}.{i}.json"]))
        i += 1
    return out


def decode_state(blobs: Mapping[str, bytes], template: TrainState) -> TrainState:
    """Load a step's blobs into `template` (see the module docs) and return it.

    Raises:
        ValueError: a blob is malformed or does not fit the template (the step is then
            treated as torn by the checkpointer, and the template is left untouched).
    """
    if MODEL not in blobs:
        raise ValueError(f"the checkpoint has no {MODEL}")
    weights = decode_weights(blobs[MODEL])
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
    The grad scaler of a step backend (`TrainState.scaler`) travels in `extra`.
    """
    buffers: dict[str, torch.Tensor] = {}

    def snapshot(state: TrainState) -> list[tuple[str, Any]]:
        if state.scaler is not None:
            state.extra = {**state.extra, SCALER: state.scaler.state_dict()}
        return snapshot_state(state, buffers)

    def decode(blobs: Mapping[str, bytes], template: TrainState) -> TrainState:
        state = decode_state(blobs, template)
        if state.scaler is not None and SCALER in state.extra:
            state.scaler.load_state_dict(dict(state.extra[SCALER]))
        return state

    return DirectoryCheckpointer(policy, snapshot=snapshot, encode=encode_snapshot, decode=decode)
