"""Byte-stable (de)serialisation of Keras variables with safetensors.

Keras's `.weights.h5` embeds auto-generated layer and optimizer names (`dense_3`), so the
same weights in a second model instance give different bytes. Here a list of variables
becomes a safetensors blob whose keys are `<prefix>/<index>` (zero-padded, in the
model's own variable order), which is identical for equal weights, across instances
and processes. Loading checks the count, shapes and dtypes of every array before it
assigns any, so a mismatched blob never leaves a half-loaded model.

`encode_weights` / `decode_weights` are the model's weights (keys `w/<index>`) as bytes
and back; `encode_arrays` / `decode_arrays` the safetensors codec they and the
checkpoint blobs share.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "arrays_of",
    "assign_arrays",
    "decode_arrays",
    "decode_weights",
    "encode_arrays",
    "encode_weights",
    "match_arrays",
    "to_numpy",
]

FORMAT = "pipekit-keras/1"
WEIGHTS = "w"
"""The key prefix of a model's weights in `encode_weights`'s bytes."""


def to_numpy(value: Any) -> np.ndarray:
    """A host copy of a Keras variable or backend tensor, C-contiguous."""
    import keras

    if hasattr(value, "value") and hasattr(value, "assign"):  # a keras.Variable
        value = value.value
    return _contiguous(keras.ops.convert_to_numpy(value))


def _contiguous(arr: Any) -> np.ndarray:
    # np.ascontiguousarray would turn a 0-d array (e.g. the optimizer's step) into 1-d
    return np.require(np.asarray(arr), requirements="C")


def arrays_of(prefix: str, variables: Sequence[Any]) -> dict[str, np.ndarray]:
    """`{"<prefix>/<index>": array}` for `variables`, in their order."""
    return {f"{prefix}/{i:05d}": to_numpy(v) for i, v in enumerate(variables)}


def encode_arrays(
    arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None
) -> bytes:
    """Safetensors bytes of named numpy arrays (the same arrays give the same bytes)."""
    from safetensors.numpy import save

    meta = {"format": FORMAT, **dict(metadata or {})}
    return save({k: _contiguous(v) for k, v in arrays.items()}, metadata=meta)


def decode_arrays(blob: bytes) -> dict[str, np.ndarray]:
    """Named numpy arrays from safetensors bytes (no code is executed, nothing unpickled)."""
    from safetensors.numpy import load

    return load(bytes(blob))


def encode_weights(variables: Sequence[Any]) -> bytes:
    """The model's weights (its variables, in order) as safetensors bytes (keys `w/<index>`).

    The same weights give the same bytes, across model instances and processes.
    """
    return encode_arrays(arrays_of(WEIGHTS, variables))


def decode_weights(blob: bytes, variables: Sequence[Any]) -> None:
    """Assign the weights of `blob` (from `encode_weights`) to `variables`, all checked first.

    Raises:
        ValueError: `blob` is not safetensors, or its arrays do not fit the variables
            (count, shapes, dtypes; nothing is assigned then).
    """
    try:
        arrays = decode_arrays(blob)
    except Exception as exc:  # safetensors raises its own error types
        raise ValueError(f"The weights blob is not a safetensors file: {exc}") from exc
    assign_arrays(WEIGHTS, variables, arrays, what="The weights blob")


def assign_arrays(
    prefix: str,
    variables: Sequence[Any],
    arrays: Mapping[str, np.ndarray],
    *,
    what: str,
    cast: bool = False,
) -> None:
    """Assign `arrays["<prefix>/<i>"]` to `variables[i]` after checking every one.

    See `match_arrays` for the arguments and errors.
    """
    for var, arr in match_arrays(prefix, variables, arrays, what=what, cast=cast):
        var.assign(arr)


def match_arrays(
    prefix: str,
    variables: Sequence[Any],
    arrays: Mapping[str, np.ndarray],
    *,
    what: str,
    cast: bool = False,
) -> list[tuple[Any, np.ndarray]]:
    """Pair `variables[i]` with `arrays["<prefix>/<i>"]`, checking count, shapes and dtypes.

    Args:
        prefix: the key prefix of this group of variables.
        variables: the Keras variables to fill, in order.
        arrays: the decoded arrays.
        what: names the source in error messages.
        cast: cast each array to its variable's dtype instead of requiring equal dtypes.

    Raises:
        ValueError: the blob holds a different number of arrays, or one has another
            shape or dtype than its variable (nothing is assigned then).
    """
    keys = sorted(k for k in arrays if k.startswith(prefix + "/"))
    if len(keys) != len(variables):
        raise ValueError(
            f"{what} holds {len(keys)} arrays under {prefix!r}, but there are "
            f"{len(variables)} variables to fill. Was it saved from another architecture?"
        )
    plan = []
    for i, var in enumerate(variables):
        key = f"{prefix}/{i:05d}"
        if key not in arrays:
            raise ValueError(f"{what} has no array {key!r}.")
        arr = arrays[key]
        shape = tuple(int(d) for d in var.shape)
        if tuple(arr.shape) != shape:
            raise ValueError(
                f"{what}: array {key!r} has shape {tuple(arr.shape)}, but variable "
                f"{getattr(var, 'path', i)!r} has shape {shape}."
            )
        if cast:
            arr = arr.astype(_dtype_name(var.dtype))
        elif np.dtype(arr.dtype).name != _dtype_name(var.dtype):
            raise ValueError(
                f"{what}: array {key!r} has dtype {arr.dtype}, but variable "
                f"{getattr(var, 'path', i)!r} has dtype {var.dtype}."
            )
        plan.append((var, arr))
    return plan


def _dtype_name(dtype: Any) -> str:
    from keras import backend

    return str(backend.standardize_dtype(dtype))
