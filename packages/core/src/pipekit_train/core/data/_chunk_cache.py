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
one call (concurrently). When every slot is pinned by concurrent gathers, a chunk
is read into a temporary array instead (correct, just not cached).

Read-ahead: given the order in which rows will be gathered (`plan`, a whole
epoch's order from the batching engine), the chunks are ranked by first use; each
gather then starts reading, in a background thread, the `ahead` chunks that follow
the ones it used, so the next shuffle window is usually in memory before it is
needed. The plan is advisory: a gather whose chunks lie far apart in it (another
iterator's order) reads nothing ahead, and a wrong plan costs reads, never results.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ._dataset import ArraySpec, Batch

__all__ = ["ChunkCache"]

ChunkReader = Callable[[Sequence[int]], list[dict[str, np.ndarray]]]


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
        read_chunks: reads the given chunk ids: a list of `{key: rows}`, one per id.
        ahead: chunks to read ahead of a gather when a plan is set (0: none).
    """

    def __init__(
        self,
        spec: Mapping[str, ArraySpec],
        length: int,
        chunk_size: int,
        capacity: int,
        read_chunks: ChunkReader,
        ahead: int = 0,
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
        self._ahead = max(0, min(int(ahead), self.capacity // 2))
        self._plan: tuple[np.ndarray, np.ndarray] | None = None  # chunks by first use, ranks
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

    # -- read-ahead -----------------------------------------------------------------------
    def plan(self, order: np.ndarray) -> None:
        """Rank the chunks by their first use in `order` (rows in the order they will be
        gathered); later gathers read ahead along that ranking.

        Samples `order` every `chunk_size // 64` rows: a chunk-aware order uses each
        chunk throughout its window, so the sample finds every chunk at a fraction of
        the cost (a chunk it misses is just not read ahead).
        """
        if not self._ahead or len(order) == 0:
            return
        stride = max(1, self._cs // 64)
        cids = np.asarray(order[::stride], dtype=np.int64) // self._cs
        chunks, first_use = np.unique(cids, return_index=True)
        seq = chunks[np.argsort(first_use, kind="stable")]
        rank = np.full(len(self._slot_of), -1, dtype=np.intp)
        rank[seq] = np.arange(len(seq))
        self._plan = (seq, rank)

    def _read_ahead(self, used: list[int]) -> None:
        """Start reading the chunks that follow `used` in the plan (lock held)."""
        plan = self._plan
        if plan is None:
            return
        seq, rank = plan
        ranks = [int(rank[c]) for c in used]
        last = max(ranks)
        if min(ranks) < 0 or last - min(ranks) >= 2 * max(self._ahead, len(used)):
            return  # this gather does not follow the plan (another iterator's order)
        owned: list[tuple[int, _Pending]] = []
        for cid in seq[last + 1 : last + 1 + self._ahead].tolist():
            if self._slot_of[cid] >= 0 or cid in self._loading:
                continue
            slot = self._take_slot()
            if slot is None:
                break
            self._pins[slot] += 1
            pending = self._loading[cid] = _Pending(slot)
            owned.append((cid, pending))
        if owned:
            thread = threading.Thread(target=self._load_ahead, args=(owned,), daemon=True)
            thread.start()

    def _load_ahead(self, owned: list[tuple[int, _Pending]]) -> None:
        """The background thread of a read-ahead."""
        try:
            self._load(owned, self._buffer_views())
        except BaseException:  # the gathers waiting for these chunks get the error
            pass
        finally:
            with self._lock:
                for _, pending in owned:
                    self._pins[pending.slot] -= 1  # type: ignore[index]

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
            if needed and self._plan is not None:
                with self._lock:  # this gather's chunks are still pinned: not evicted
                    self._read_ahead(needed)
            if not temporary:  # every chunk in its slot: one take per key
                shift = np.empty(needed[-1] - first + 1 if needed else 0, dtype=np.intp)
                for cid in needed:
                    shift[cid - first] = (slots[cid] - cid) * cs  # type: ignore[operator]
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
            values = self._read_chunks([cid for cid, _ in owned])
            for (cid, pending), value in zip(owned, values, strict=True):
                if pending.slot is None:
                    temporary[cid] = value
                    continue
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
