"""One chunk of a cache build: check the computed rows, write them, mark the chunk done.

Shared by the in-process build and the Ray chunk tasks, so every executor writes a
chunk the same way (the same zarr calls, hence the same bytes) and marks it done
only after all its arrays are written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.data.datasets._dataset import ArraySpec

from ._zarr_store import DONE_KEY

__all__ = ["check_batch", "open_chunk_arrays", "write_chunk"]


def check_batch(batch: Any, spec: Mapping[str, ArraySpec], start: int, stop: int) -> None:
    """Raise a `ConfigError` unless `batch` holds rows `start:stop` of the element spec."""
    keys = sorted(batch) if isinstance(batch, Mapping) else None
    if keys != sorted(spec):
        raise ConfigError(
            f"Samples {start}..{stop - 1} have keys {keys}, but sample 0 has {sorted(spec)}. "
            "Received: samples with different keys. Make every sample have the same keys."
        )
    for key, s in spec.items():
        arr = batch[key]
        if arr.shape != (stop - start, *s.shape) or arr.dtype != s.dtype:
            raise ConfigError(
                f"Samples {start}..{stop - 1} of key {key!r} do not match sample 0. Received: "
                f"shape {arr.shape[1:]} and dtype {arr.dtype}, expected shape {s.shape} and dtype "
                f"{s.dtype}. Make every sample the same shape and dtype."
            )


def write_chunk(
    arrays: Mapping[str, Any], done: Any, batch: Mapping[str, Any], cid: int, start: int, stop: int
) -> None:
    """Write rows `start:stop` (all of chunk `cid`) of every key, then mark `cid` done.

    Args:
        arrays: the zarr array of each key.
        done: the `_pipekit_done` zarr array.
        batch: the rows, one array per key.
        cid: the chunk id.
        start: the chunk's first row.
        stop: one past its last row.
    """
    for key, zarray in arrays.items():
        zarray[start:stop] = batch[key]
    done[cid] = True


def open_chunk_arrays(group: Any, keys: Any) -> tuple[dict[str, Any], Any]:
    """The zarr arrays of `keys` and the `_pipekit_done` array of a cache group."""
    return {k: group[k] for k in keys}, group[DONE_KEY]
