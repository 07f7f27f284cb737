"""Deterministic, pickle-free byte formats for torch state: safetensors plus JSON.

- `encode_weights` / `decode_weights`: a module's state dict as safetensors bytes.
  Tensors that alias each other exactly (tied weights) are stored once, under the
  smallest name, and the other names are recorded in the header metadata; tensors that
  merely overlap in memory are copied. The same weights give the same bytes.
- `encode_optimizer` / `decode_optimizer`: `optimizer.state_dict()` split into a
  safetensors blob (every tensor) and a JSON document (everything else).
- `to_json_tree` / `from_json_tree`: JSON with tensors swapped for references into a
  tensor dict (used for optimizer and scheduler state).
- `snapshot_tensors`: host copies of named tensors into reused buffers, keeping exact
  aliases as one tensor, so `encode_tensors` gives the same bytes later, off the
  training thread.

Nothing here unpickles: safetensors and `json` are the only decoders.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch
from safetensors.torch import load as _st_load
from safetensors.torch import save as _st_save

__all__ = [
    "ALIASES_KEY",
    "decode_optimizer",
    "decode_weights",
    "decode_tensors",
    "encode_json_tree",
    "encode_optimizer",
    "encode_weights",
    "encode_tensors",
    "from_json_tree",
    "snapshot_tensors",
    "to_json_tree",
]

ALIASES_KEY = "pipekit.aliases"
_TENSOR_REF = "__tensor__"


def _storage_ptr(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().data_ptr())
    except Exception:  # meta tensors and exotic subclasses
        return 0


def _alias_key(t: torch.Tensor) -> tuple[Any, ...]:
    return (t.device, _storage_ptr(t), t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()))


def _plain(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.contiguous()


def encode_tensors(
    tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> bytes:
    """Safetensors bytes of named tensors (exact aliases kept once, overlaps copied).

    Args:
        tensors: name → tensor (any device; moved to the CPU, made contiguous).
        metadata: optional string metadata (one entry keeps the header byte-stable).

    Returns:
        Bytes that depend only on the names, dtypes, shapes and values.
    """
    groups: dict[tuple[Any, ...], list[str]] = {}
    for name in sorted(tensors):
        value = tensors[name]
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name!r} is a {type(value).__name__}, not a tensor")
        groups.setdefault(_alias_key(value), []).append(name)
    aliases: dict[str, str] = {}
    kept: dict[str, torch.Tensor] = {}
    for names in groups.values():
        keep = names[0]
        kept[keep] = tensors[keep]
        for other in names[1:]:
            aliases[other] = keep
    # tensors that overlap without being identical (views of one buffer) are copied
    by_storage: dict[tuple[Any, int], list[str]] = {}
    for name, value in kept.items():
        ptr = _storage_ptr(value)
        if ptr:
            by_storage.setdefault((value.device, ptr), []).append(name)
    shared = {n for names in by_storage.values() if len(names) > 1 for n in names}
    out = {name: (_plain(v).clone() if name in shared else _plain(v)) for name, v in kept.items()}
    meta = dict(metadata or {})
    if aliases:
        meta[ALIASES_KEY] = json.dumps(aliases, sort_keys=True, separators=(",", ":"))
    if len(meta) > 1:  # safetensors keeps metadata in a hash map: one key stays byte-stable
        meta = {"pipekit": json.dumps(meta, sort_keys=True, separators=(",", ":"))}
    return _st_save(out, metadata=meta or None)


def snapshot_tensors(
    tensors: Mapping[str, Any], buffers: dict[str, torch.Tensor], prefix: str = ""
) -> dict[str, torch.Tensor]:
    """Copy named tensors into reused CPU buffers (`buffers[prefix + name]`).

    Tensors that alias each other exactly stay one tensor in the copy, so
    `encode_tensors(snapshot_tensors(t, ...))` equals `encode_tensors(t)` byte for byte.

    Raises:
        TypeError: an entry is not a tensor.
    """
    groups: dict[tuple[Any, ...], list[str]] = {}
    for name in sorted(tensors):
        value = tensors[name]
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name!r} is a {type(value).__name__}, not a tensor")
        groups.setdefault(_alias_key(value), []).append(name)
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for names in groups.values():
            src = tensors[names[0]].detach()
            key = prefix + names[0]
            buf = buffers.get(key)
            if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
                buf = torch.empty(src.shape, dtype=src.dtype, device="cpu")
                buffers[key] = buf
            buf.copy_(src)
            for name in names:
                out[name] = buf
    return out


def _read_metadata(blob: bytes) -> dict[str, str]:
    if len(blob) < 8:
        raise ValueError("the safetensors blob is truncated")
    n = int.from_bytes(blob[:8], "little")
    if n <= 0 or 8 + n > len(blob):
        raise ValueError("the safetensors header is truncated")
    header = json.loads(blob[8 : 8 + n].decode("utf-8"))
    meta = header.get("__metadata__") or {}
    if "pipekit" in meta:
        meta = {**meta, **json.loads(meta.pop("pipekit"))}
    return {str(k): str(v) for k, v in meta.items()}


def decode_tensors(blob: bytes) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Inverse of `encode_tensors`: `(tensors with aliases expanded, metadata)`.

    Raises:
        ValueError: the bytes are not a valid safetensors document.
    """
    try:
        tensors = dict(_st_load(bytes(blob)))
        meta = _read_metadata(blob)
    except ValueError:
        raise
    except Exception as exc:  # safetensors raises its own error types for bad bytes
        raise ValueError(f"not a valid safetensors blob: {exc}") from exc
    aliases = json.loads(meta.pop(ALIASES_KEY, "{}"))
    for alias, target in aliases.items():
        if target not in tensors:
            raise ValueError(f"alias {alias!r} points at a missing tensor {target!r}")
        tensors[alias] = tensors[target]
    return tensors, meta


def encode_weights(state_dict: Mapping[str, Any]) -> bytes:
    """Safetensors bytes of a module state dict (tied weights stored once).

    Raises:
        TypeError: the state dict holds a non-tensor entry (e.g. `get_extra_state`).
    """
    return encode_tensors(state_dict)


def decode_weights(blob: bytes) -> dict[str, torch.Tensor]:
    """Inverse of `encode_weights`."""
    return decode_tensors(blob)[0]


# -- JSON trees with tensors stored aside ------------------------------------------------
def to_json_tree(value: Any, tensors: dict[str, torch.Tensor], prefix: str) -> Any:
    """Replace tensors in a nested structure by `{"__tensor__": name}` (stored in `tensors`).

    Dict keys become strings; their original type is kept as a `{"__int_keys__": ...}`
    marker so integer keys (optimizer state indices) survive the round trip.
    """
    if isinstance(value, torch.Tensor):
        name = f"{prefix}"
        tensors[name] = value
        return {_TENSOR_REF: name}
    if isinstance(value, Mapping):
        int_keys = all(isinstance(k, int) and not isinstance(k, bool) for k in value) and bool(
            value
        )
        items = {str(k): to_json_tree(v, tensors, f"{prefix}/{k}") for k, v in value.items()}
        return {"__int_keys__": items} if int_keys else {"__dict__": items}
    if isinstance(value, tuple):
        return {
            "__tuple__": [to_json_tree(v, tensors, f"{prefix}/{i}") for i, v in enumerate(value)]
        }
    if isinstance(value, list):
        return [to_json_tree(v, tensors, f"{prefix}/{i}") for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot store a {type(value).__name__} at {prefix!r} without pickle")


def from_json_tree(value: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """Inverse of `to_json_tree`."""
    if isinstance(value, list):
        return [from_json_tree(v, tensors) for v in value]
    if isinstance(value, dict):
        if _TENSOR_REF in value:
            return tensors[value[_TENSOR_REF]]
        if "__int_keys__" in value:
            return {int(k): from_json_tree(v, tensors) for k, v in value["__int_keys__"].items()}
        if "__tuple__" in value:
            return tuple(from_json_tree(v, tensors) for v in value["__tuple__"])
        if "__dict__" in value:
            return {k: from_json_tree(v, tensors) for k, v in value["__dict__"].items()}
        raise ValueError(f"unexpected JSON object with keys {sorted(value)}")
    return value


def encode_optimizer(state: Mapping[str, Any]) -> tuple[bytes, bytes]:
    """`(safetensors bytes, JSON bytes)` of an `optimizer.state_dict()` (or any state dict)."""
    tensors: dict[str, torch.Tensor] = {}
    tree = to_json_tree(dict(state), tensors, "s")
    return encode_tensors(tensors), encode_json_tree(tree)


def encode_json_tree(tree: Any) -> bytes:
    """The JSON bytes of a `to_json_tree` result (the second half of `encode_optimizer`)."""
    return json.dumps(tree, sort_keys=True, separators=(",", ":"), allow_nan=True).encode()


def decode_optimizer(tensor_blob: bytes, json_blob: bytes) -> dict[str, Any]:
    """Inverse of `encode_optimizer`."""
    tensors, _ = decode_tensors(tensor_blob)
    return from_json_tree(json.loads(json_blob.decode()), tensors)
