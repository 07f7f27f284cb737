"""Reused host buffers for checkpoint snapshots.

An async checkpoint must copy the training state before the next step changes it, and
that copy is all the training thread should pay for. `HostBuffers` keeps one
preallocated numpy array per name and copies into it (`np.copyto`), so a save after the
first allocates nothing; encoding, hashing and writing then happen on the writer thread.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["HostBuffers"]


class HostBuffers:
    """One reused host array per name.

    The arrays handed out stay valid until the next `copy`/`buffer` call for the same
    name, so a checkpointer must finish writing one snapshot before it takes the next
    (`DirectoryCheckpointer.save` waits for the previous write first).
    """

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}

    def buffer(self, name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """The buffer for `name`, (re)allocated if its shape or dtype changed."""
        dtype = np.dtype(dtype)
        buf = self._buffers.get(name)
        if buf is None or buf.shape != tuple(shape) or buf.dtype != dtype:
            buf = np.empty(tuple(shape), dtype)
            self._buffers[name] = buf
        return buf

    def copy(self, name: str, value: Any) -> np.ndarray:
        """Copy `value` (anything `np.asarray` takes) into the buffer for `name`; return it."""
        src = np.asarray(value)
        buf = self.buffer(name, src.shape, src.dtype)
        np.copyto(buf, src, casting="no")
        return buf

    def __len__(self) -> int:
        return len(self._buffers)

    @property
    def nbytes(self) -> int:
        """Bytes held by all buffers."""
        return sum(b.nbytes for b in self._buffers.values())
