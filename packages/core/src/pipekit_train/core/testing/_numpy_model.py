"""A pure-numpy model operator for tests and for the numpy reference adapter.

`NumpyLinearOp("pipekit_train.core.testing._numpy_model:linear", in_size=2, out_size=2)`
wraps a `LinearModel` (`x @ W + b`). Its weights travel in a tiny, safe, byte-stable
format written here (a JSON header followed by raw little-endian array bytes), so core
needs neither pickle nor safetensors:

```
bytes 0..7    magic  b"PKTNPY1\\0"
bytes 8..15   header length H, unsigned 64-bit little-endian
bytes 16..    header: compact JSON, sorted keys,
              {"arrays": [{"name", "dtype", "shape", "offset", "nbytes"}, ...]} sorted by name
then          the arrays' C-order little-endian bytes, back to back, in header order
```

The same arrays always give the same bytes. Only boolean, integer, unsigned, float and
complex dtypes are accepted, so decoding never creates Python objects.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pipekit_train.core._checks import positive_int
from pipekit_train.core._errors import ConfigError
from pipekit_train.core.model._operators import ModelOpBase
from pipekit_train.core.model._trust import model_factory

if TYPE_CHECKING:
    pass

__all__ = ["LinearModel", "NumpyLinearOp", "decode_arrays", "encode_arrays", "linear"]

_MAGIC = b"PKTNPY1\x00"
_SAFE_KINDS = frozenset("biufc")


def _le_dtype(dtype: np.dtype) -> np.dtype:
    return dtype.newbyteorder("<") if dtype.byteorder not in ("|", "<") else dtype


def encode_arrays(arrays: Mapping[str, np.ndarray]) -> bytes:
    """Encode named numpy arrays into deterministic bytes (see the module docstring).

    Args:
        arrays: name → array. Names are sorted; arrays are written C-order little-endian.

    Raises:
        ConfigError: an array has a dtype that is not bool/int/uint/float/complex.
    """
    entries = []
    chunks = []
    offset = 0
    for name in sorted(arrays):
        arr = np.asarray(arrays[name])
        if arr.dtype.kind not in _SAFE_KINDS:
            raise ConfigError(
                f"Weights must be numeric arrays. Received: {name}.dtype={arr.dtype}. "
                "Use a bool, int, uint, float or complex dtype."
            )
        dtype = _le_dtype(arr.dtype)
        data = np.ascontiguousarray(arr, dtype=dtype).tobytes()
        entries.append(
            {
                "name": str(name),
                "dtype": dtype.str,
                "shape": [int(s) for s in arr.shape],
                "offset": offset,
                "nbytes": len(data),
            }
        )
        chunks.append(data)
        offset += len(data)
    header = json.dumps({"arrays": entries}, sort_keys=True, separators=(",", ":")).encode()
    return b"".join([_MAGIC, struct.pack("<Q", len(header)), header, *chunks])


def decode_arrays(blob: bytes) -> dict[str, np.ndarray]:
    """Decode bytes written by `encode_arrays` into name → (writable) array.

    Raises:
        ConfigError: the bytes are not in this format or are inconsistent.
    """
    blob = bytes(blob)

    def bad(why: str) -> ConfigError:
        return ConfigError(
            f"The weight bytes are not a valid numpy weight blob: {why}. "
            f"Received: {len(blob)} bytes. Pass bytes written by `serialize_weights()`."
        )

    if len(blob) < 16 or blob[:8] != _MAGIC:
        raise bad("missing the PKTNPY1 magic header")
    (hlen,) = struct.unpack("<Q", blob[8:16])
    if 16 + hlen > len(blob):
        raise bad(f"header length {hlen} runs past the end")
    try:
        header = json.loads(blob[16 : 16 + hlen].decode())
        entries = header["arrays"]
        if not isinstance(entries, list):
            raise TypeError("`arrays` is not a list")
    except (ValueError, KeyError, TypeError) as exc:
        raise bad(f"unreadable header ({exc})") from exc
    body = memoryview(blob)[16 + hlen :]
    out: dict[str, np.ndarray] = {}
    expected_offset = 0
    for entry in entries:
        try:
            name = entry["name"]
            dtype = np.dtype(entry["dtype"])
            shape = tuple(int(s) for s in entry["shape"])
            offset = int(entry["offset"])
            nbytes = int(entry["nbytes"])
        except (KeyError, TypeError, ValueError) as exc:
            raise bad(f"malformed array entry {entry!r}") from exc
        if dtype.kind not in _SAFE_KINDS or dtype.fields is not None or dtype.subdtype is not None:
            raise bad(f"array {name!r} has unsupported dtype {entry['dtype']!r}")
        if not isinstance(name, str) or any(s < 0 for s in shape) or name in out:
            raise bad(f"array {name!r} has a bad shape or a duplicate name")
        if (
            offset != expected_offset
            or nbytes != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        ):
            raise bad(f"array {name!r} has inconsistent offset/size")
        if offset + nbytes > len(body):
            raise bad(
                f"array {name!r} is truncated: it needs {nbytes} bytes at offset {offset}, body has {len(body)}"
            )
        out[name] = np.frombuffer(body[offset : offset + nbytes], dtype=dtype).reshape(shape).copy()
        expected_offset += nbytes
    if expected_offset != len(body):
        raise bad(f"{len(body) - expected_offset} trailing bytes after the arrays")
    return out


class LinearModel:
    """`y = x @ W + b` with `W` of shape `(in_size, out_size)` and `b` of shape `(out_size,)`.

    Attributes:
        W: the weight matrix (float32).
        b: the bias (float32).
    """

    def __init__(self, W: np.ndarray, b: np.ndarray):
        self.W = W
        self.b = b

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Apply the affine map to a batch (or a single vector)."""
        return np.asarray(x, dtype=self.W.dtype) @ self.W + self.b

    def parameters(self) -> dict[str, np.ndarray]:
        """The named parameter arrays (`{"W", "b"}`), by reference."""
        return {"W": self.W, "b": self.b}

    def replace(self, **params: np.ndarray) -> LinearModel:
        """Return a new model with some parameters replaced."""
        merged = {**self.parameters(), **params}
        return LinearModel(merged["W"], merged["b"])

    def __repr__(self) -> str:
        return f"LinearModel(in_size={self.W.shape[0]}, out_size={self.W.shape[1]})"


@model_factory
def linear(in_size: int, out_size: int, *, key: int | np.random.Generator = 0) -> LinearModel:
    """Build a `LinearModel` with float32 weights drawn from `np.random.default_rng(key)`.

    `W` is drawn from N(0, 1/in_size) and `b` starts at zero.

    Args:
        in_size: input features.
        out_size: output features.
        key: a seed (or a `np.random.Generator`).
    """
    in_size = positive_int("in_size", in_size)
    out_size = positive_int("out_size", out_size)
    rng = np.random.default_rng(key)
    W = (rng.standard_normal((in_size, out_size)) / np.sqrt(in_size)).astype(np.float32)
    b = np.zeros((out_size,), dtype=np.float32)
    return LinearModel(W, b)


class NumpyLinearOp(ModelOpBase):
    """A numpy model operator (`backend = "numpy"`) around a model with `parameters()`.

    The factory is called as `factory(**kwargs, key=seed)` and must return an object with
    `__call__(x)`, `parameters() -> dict[str, np.ndarray]` and `replace(**params)`;
    `linear` in this module is the canonical one.

    Args:
        factory: `"pipekit_train.core.testing._numpy_model:linear"` or the function itself.
        seed: seed passed to the factory as `key`.
        **kwargs: JSON keyword arguments for the factory (e.g. `in_size`, `out_size`).
    """

    backend: ClassVar[str] = "numpy"

    def _build(self, factory: Callable[..., Any], kwargs: dict[str, Any], seed: int) -> Any:
        if "key" in kwargs:
            raise ConfigError(
                "`key` is set from `seed`; do not pass it as a factory keyword. "
                f"Received: key={kwargs['key']!r}. Use NumpyLinearOp(factory, seed=...)."
            )
        return factory(**kwargs, key=seed)

    def __call__(self, inputs: Any) -> np.ndarray:
        """Run the model on a numpy batch and return a numpy array."""
        return np.asarray(self.model(np.asarray(inputs)))

    def serialize_weights(self) -> bytes:
        """The parameters in the byte-stable numpy weight format."""
        return encode_arrays(self.model.parameters())

    def _load_weights(self, blob: bytes) -> None:
        arrays = decode_arrays(blob)
        current = self.model.parameters()
        if set(arrays) != set(current):
            raise ConfigError(
                f"The weights do not fit this model: it has parameters {sorted(current)}. "
                f"Received: parameters={sorted(arrays)}. Load weights saved from the same config."
            )
        for name, ref in current.items():
            got = arrays[name]
            if got.shape != ref.shape or got.dtype != ref.dtype:
                raise ConfigError(
                    f"The weights do not fit this model: `{name}` should be "
                    f"{ref.dtype}{list(ref.shape)}. Received: {name}={got.dtype}{list(got.shape)}. "
                    "Load weights saved from the same config."
                )
        self.model = self.model.replace(
            **{k: v.astype(current[k].dtype) for k, v in arrays.items()}
        )
