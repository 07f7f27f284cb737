"""An LRU cache of whole chunks held in preallocated slot buffers.

Out-of-core `CachedDataset` reading keeps up to `capacity` chunks in one buffer per
key, shape `(capacity * chunk_size, *sample_shape)`: chunk `c` lives in slot `s`,
rows `[s * chunk_size, (s + 1) * chunk_size)`. A gather of rows from resident
chunks is then one `take` per key (row `i` of chunk `c` sits at
`i + (s - c) * chunk_size`), as fast as an in-memory gather; no sort and no
per-chunk scatter.

Thread-safe for the prefetch threads of `make_batches`: a gather pins the slots it
reads (pinned slots are never evicted), each chunk is read once even when several
threads need it at the same time, and the missing chunks of a gather are read in
one call (straight into their slots when the reader can; remote files are fetched
concurrently). When every slot is pinned by concurrent gathers, a chunk is read
into a temporary array instead (correct, just not cached).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from pipekit_train.core.data.datasets._dataset import ArraySpec, Batch

__all__ = ["ChunkCache"]

# read_chunks(cids, into) -> one `{key: rows}` per chunk. `into[i]` is None or the
# chunk's slot (`{key: view of chunk_size rows}`); a reader that decodes straight into
# it returns that same dict, which then needs no copy.
ChunkReader = Callable[
    [Sequence[int], Sequence[dict[str, np.ndarray] | None]], list[dict[str, np.ndarray]]
]


class _Pending:
    """A chunk being read by one thread while others wait for it."""

    def __init__(self, slot: int | None) -> None:
        self.slot = slot
        self._event = threading.Event()
        self._value: dict[str, np.ndarray] | None = None
        self._error: BaseException | None = None

    def set(self, value: dict[str, np.ndarray] | None, error: BaseException | None) -> None:
        self._value, self._error = value, error
        self._event.set()

    def result(self) -> dict[str, np.ndarray] | None:
        """The chunk's arrays when it was read into no slot; None when it is in its slot."""
        self._event.wait()
        if self._error is not None:
            raise self._error
        return self._value


class ChunkCache:
    """Whole chunks of a chunked dataset, read on demand, gathered with one `take`.

    Args:
        spec: shape and dtype per key.
        length: rows in the dataset.
        chunk_size: rows per chunk (the last chunk may be shorter).
        capacity: chunks held at most (clipped to the number of chunks).
        read_chunks: reads the given chunk ids: a list of `{key: rows}`, one per id
            (see `ChunkReader`: it may decode straight into the chunk's slot).
    """

    def __init__(
        self,
        spec: Mapping[str, ArraySpec],
        length: int,
        chunk_size: int,
        capacity: int,
        read_chunks: ChunkReader,
    ) -> None:
        self._spec = dict(spec)
        self._length = length
        self._cs = chunk_size
        num_chunks = -(-length // chunk_size)
        self.capacity = max(1, min(int(capacity), num_chunks))
        self._read_chunks = read_chunks
        self._buffers: dict[str, np.ndarray] | None = None  # allocated on first use
        self._slot_of = np.full(num_chunks, -1, dtype=np.intp)  # chunk -> slot
        self._chunk_in = [-1] * self.capacity  # slot -> chunk
        self._pins = [0] * self.capacity
        self._free = list(range(self.capacity - 1, -1, -1))
        self._lru: OrderedDict[int, None] = OrderedDict()  # resident slots, oldest first
        self._loading: dict[int, _Pending] = {}
        self._lock = threading.Lock()
        self.reads = 0

    # -- slots (call with the lock held) -------------------------------------------------
    def _take_slot(self) -> int | None:
        if self._free:
            return self._free.pop()
        for slot in self._lru:
            if not self._pins[slot]:
                del self._lru[slot]
                self._slot_of[self._chunk_in[slot]] = -1
                self._chunk_in[slot] = -1
                return slot
        return None  # every slot is pinned by concurrent gathers

    def _buffer_views(self) -> dict[str, np.ndarray]:
        if self._buffers is None:
            rows = self.capacity * self._cs
            self._buffers = {
                k: np.empty((rows, *s.shape), dtype=s.dtype) for k, s in self._spec.items()
            }
        return self._buffers

    def _slot_views(self, slot: int, buffers: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        start = slot * self._cs
        return {k: b[start : start + self._cs] for k, b in buffers.items()}

    # -- gathering -----------------------------------------------------------------------
    def gather(self, idx: np.ndarray) -> Batch:
        """Rows `idx` (in range, intp) of every key, reading missing chunks first."""
        cs = self._cs
        cids = idx // cs
        first = int(cids.min(initial=0))
        needed = (np.flatnonzero(np.bincount(cids - first)) + first).tolist() if idx.size else []
        slots: dict[int, int | None] = {}
        owned: list[tuple[int, _Pending]] = []
        waiting: list[tuple[int, _Pending]] = []
        pinned: list[int] = []
        with self._lock:
            buffers = self._buffer_views()
            for cid in needed:
                resident = int(self._slot_of[cid])
                slot: int | None = resident
                if resident >= 0:
                    self._lru.move_to_end(resident)
                else:
                    pending = self._loading.get(cid)
                    if pending is None:
                        pending = self._loading[cid] = _Pending(self._take_slot())
                        owned.append((cid, pending))
                    else:
                        waiting.append((cid, pending))
                    slot = pending.slot
                if slot is not None:
                    self._pins[slot] += 1
                    pinned.append(slot)
                slots[cid] = slot
        try:
            temporary = self._load(owned, buffers)
            for cid, pending in waiting:
                value = pending.result()
                if value is not None:
                    temporary[cid] = value
            if not temporary:  # every chunk in its slot: one take per key
                shift = np.empty(needed[-1] - first + 1 if needed else 0, dtype=np.intp)
                for cid in needed:
                    shift[cid - first] = (slots[cid] - cid) * cs  # type: ignore[operator]  # no temporary chunk: every slot is an int
                local = idx + shift[cids - first]
                return {k: b.take(local, axis=0) for k, b in buffers.items()}
            return self._gather_mixed(idx, cids, needed, slots, temporary, buffers)
        finally:
            with self._lock:
                for slot in pinned:
                    self._pins[slot] -= 1

    def _load(
        self, owned: list[tuple[int, _Pending]], buffers: dict[str, np.ndarray]
    ) -> dict[int, dict[str, np.ndarray]]:
        """Read the chunks this gather owns into their slots (or temporary arrays)."""
        temporary: dict[int, dict[str, np.ndarray]] = {}
        if not owned:
            return temporary
        try:
            into = [None if p.slot is None else self._slot_views(p.slot, buffers) for _, p in owned]
            values = self._read_chunks([cid for cid, _ in owned], into)
            for (cid, pending), value, target in zip(owned, values, into, strict=True):
                if pending.slot is None:
                    temporary[cid] = value
                elif value is not target:  # not decoded in place: copy into the slot
                    start = pending.slot * self._cs
                    for key, rows in value.items():
                        buffers[key][start : start + len(rows)] = rows
        except BaseException as exc:
            with self._lock:
                for cid, pending in owned:
                    del self._loading[cid]
                    if pending.slot is not None:
                        self._free.append(pending.slot)
            for _, pending in owned:
                pending.set(None, exc)
            raise
        with self._lock:
            for cid, pending in owned:
                del self._loading[cid]
                if pending.slot is not None:
                    self._slot_of[cid] = pending.slot
                    self._chunk_in[pending.slot] = cid
                    self._lru[pending.slot] = None
            self.reads += len(owned)
        for cid, pending in owned:
            pending.set(temporary.get(cid), None)
        return temporary

    def _gather_mixed(
        self,
        idx: np.ndarray,
        cids: np.ndarray,
        needed: list[int],
        slots: Mapping[int, int | None],
        temporary: Mapping[int, dict[str, np.ndarray]],
        buffers: Mapping[str, np.ndarray],
    ) -> Batch:
        """The gather when some chunks are not in slots: chunk by chunk."""
        cs = self._cs
        out = {k: np.empty((idx.size, *s.shape), dtype=s.dtype) for k, s in self._spec.items()}
        for cid in needed:
            rows = np.flatnonzero(cids == cid)
            offsets = idx[rows] - cid * cs
            slot = slots[cid]
            for key, target in out.items():
                if cid in temporary:
                    source = temporary[cid][key]
                else:
                    assert slot is not None
                    source = buffers[key][slot * cs : (slot + 1) * cs]
                target[rows] = source.take(offsets, axis=0)
        return out
