"""Exact resume of a stateful training loader (torchdata's `StatefulDataLoader`).

A loader with `state_dict()` / `load_state_dict()` — torchdata's `StatefulDataLoader`
is the one most users have — knows its position inside the epoch. The Lightning bridge
saves that position in every pipekit checkpoint (under `meta.json`'s `data_iter`) and
hands it back to the loader before Lightning first iterates it, so a resumed run
continues at the batch after the last one trained on.

Nothing is pickled: the state dict is written as JSON, with tensors (the sampler's
generator state is a `ByteTensor`) encoded explicitly as dtype, shape and base64 bytes.
A state holding anything else (an arbitrary object, `bytes`) is refused before the
first step with an error naming where in the state it sits.

Besides the loader's own state, the position saves the states of the `torch.Generator`s
of the loader and its sampler: torchdata restores a shuffled sampler's generator to the
start of the epoch and replays its permutation, but the loader's per-epoch seed draw
happened before the restore, so without this the *next* epoch's permutation would
differ from an uninterrupted run's. It also saves the epoch, so a resumed run's history
counts epochs as the uninterrupted one does.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import torch

from pipekit_train.core.adapter import ConfigError

from ._weights import from_json_tree, to_json_tree

__all__ = [
    "KIND",
    "decode_loader_state",
    "encode_loader_state",
    "generators",
    "is_sized",
    "is_stateful_loader",
    "loader_position",
    "restore_generators",
]

KIND = "torch-loader-state"


def is_stateful_loader(loader: Any) -> bool:
    """Whether `loader` is a torch `DataLoader` with `state_dict()` and `load_state_dict()`."""
    return (
        isinstance(loader, torch.utils.data.DataLoader)
        and callable(getattr(loader, "state_dict", None))
        and callable(getattr(loader, "load_state_dict", None))
    )


def is_sized(loader: Any) -> bool:
    """Whether `len(loader)` works (then Lightning does not read a batch ahead)."""
    try:
        len(loader)
    except TypeError:
        return False
    return True


def generators(loader: Any) -> dict[str, torch.Generator]:
    """The distinct `torch.Generator`s of the loader and its samplers, by role."""
    found: dict[str, torch.Generator] = {}
    candidates = {
        "loader": getattr(loader, "generator", None),
        "sampler": getattr(getattr(loader, "sampler", None), "generator", None),
        "batch_sampler": getattr(
            getattr(getattr(loader, "batch_sampler", None), "sampler", None), "generator", None
        ),
    }
    for role, gen in candidates.items():
        if isinstance(gen, torch.Generator) and not any(gen is g for g in found.values()):
            found[role] = gen
    return found


def _encode_tensor(t: torch.Tensor) -> dict[str, Any]:
    t = t.detach().cpu().contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "data": base64.b64encode(raw).decode("ascii"),
    }


def _decode_tensor(entry: Mapping[str, Any]) -> torch.Tensor:
    dtype = getattr(torch, str(entry["dtype"]), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown tensor dtype {entry['dtype']!r} in a saved loader state")
    shape = [int(d) for d in entry["shape"]]
    raw = base64.b64decode(entry["data"])
    if not raw:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return flat.view(dtype).reshape(shape).clone()


def encode_loader_state(state: Mapping[str, Any], *, loader: Any = None) -> dict[str, Any]:
    """`state` (a loader's `state_dict()`) as a JSON-able dict; see the module docs.

    Raises:
        ConfigError: the state holds a value JSON cannot represent without pickle.
    """
    tensors: dict[str, torch.Tensor] = {}
    try:
        tree = to_json_tree(dict(state), tensors, "state")
    except TypeError as err:
        name = type(loader).__name__ if loader is not None else "loader"
        raise ConfigError(
            f"The training loader's state_dict() cannot be saved without pickle: {err}. "
            f"Received: data={name}. Keep the loader's state (and its sampler's and "
            "dataset's state_dict()) to ints, floats, bools, strings, lists, dicts and "
            "tensors, or pass a core dataset."
        ) from None
    return {"tree": tree, "tensors": {k: _encode_tensor(v) for k, v in tensors.items()}}


def decode_loader_state(encoded: Mapping[str, Any]) -> dict[str, Any]:
    """Inverse of `encode_loader_state`: the dict to pass to `load_state_dict()`."""
    tensors = {k: _decode_tensor(v) for k, v in encoded["tensors"].items()}
    out = from_json_tree(encoded["tree"], tensors)
    if not isinstance(out, dict):
        raise ValueError("a saved loader state must be a dict")
    return out


def loader_position(loader: Any, epoch: int) -> dict[str, Any]:
    """The JSON position saved in a checkpoint: loader state, generator states, epoch."""
    return {
        "kind": KIND,
        "epoch": int(epoch),
        "state": encode_loader_state(loader.state_dict(), loader=loader),
        "generators": {
            role: _encode_tensor(gen.get_state()) for role, gen in generators(loader).items()
        },
    }


def restore_generators(loader: Any, saved: Mapping[str, Any]) -> None:
    """Set the loader's (and its samplers') generators to the saved states, by role."""
    live = generators(loader)
    for role, entry in saved.items():
        if role in live:
            live[role].set_state(_decode_tensor(entry))
