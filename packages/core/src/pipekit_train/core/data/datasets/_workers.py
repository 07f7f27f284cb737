"""Compute blocks of a dataset in worker processes (used by cache builds and scans).

The dataset is sent once to each worker (pickled through the process pool: this is
inter-process transport of a live object, not a load path for stored data). Blocks
are computed in parallel and yielded in submission order, so the result is
byte-identical to a serial pass.
"""

from __future__ import annotations

import pickle
from collections import deque
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from pipekit_train.core._errors import ConfigError

from ._dataset import gather_batch

if TYPE_CHECKING:  # imported lazily: multiprocessing costs ~50 ms at import
    from concurrent.futures import Future, ProcessPoolExecutor

__all__ = ["check_workers", "compute_blocks", "open_pool", "raw_indices", "run_block"]

_MP_CONTEXTS = ("spawn", "forkserver", "fork")
_WORKER_DATASET: Any = None


def check_workers(dataset: Any, workers: Any, mp_context: Any) -> int:
    """Validate `workers` / `mp_context` and that `dataset` can be sent to workers."""
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 0:
        raise ConfigError(
            f"`workers` must be a non-negative int (0 computes in this process). "
            f"Received: workers={workers!r}. Use e.g. workers=4."
        )
    if mp_context not in _MP_CONTEXTS:
        raise ConfigError(
            f"`mp_context` must be one of {list(_MP_CONTEXTS)}. Received: mp_context={mp_context!r}."
        )
    if workers > 0:
        try:
            pickle.dumps(dataset)
        except Exception as exc:
            raise ConfigError(
                "`workers` > 0 sends the dataset to worker processes, so it must be picklable. "
                f"Received: workers={workers}, but the dataset cannot be pickled ({exc}). Define "
                "the simulator and sampler at module level (no lambdas or closures), or use "
                "workers=0."
            ) from exc
    return int(workers)


def _init_worker(dataset: Any) -> None:
    global _WORKER_DATASET
    _WORKER_DATASET = dataset


def _stats_of(dataset: Any) -> dict[str, int] | None:
    stats = getattr(dataset, "stats", None)
    return dict(stats) if isinstance(stats, dict) else None


def raw_indices(dataset: Any, start: int, stop: int) -> np.ndarray | None:
    """For a scanned `"drop"` simulation: the raw item indices of rows `start:stop`.

    Workers hold an unscanned copy of the dataset, so the main process resolves the
    mapping and sends raw indices.
    """
    valid = getattr(dataset, "valid_indices", None)
    if valid is None or not hasattr(dataset, "_raw_batch"):
        return None
    return np.asarray(valid[start:stop], dtype=np.int64)


def run_block(
    dataset: Any, kind: str, start: int, stop: int, raw: np.ndarray | None = None
) -> tuple[Any, dict[str, int] | None]:
    """Compute one block in this process: `kind` is `"rows"` or `"validity"`.

    Returns the result and the change of `dataset.stats` while computing it.
    """
    before = _stats_of(dataset)
    if kind == "rows" and raw is not None:
        result: Any = dataset._raw_batch(raw)
    elif kind == "rows":
        result = gather_batch(dataset, np.arange(start, stop, dtype=np.intp))
    else:
        result = dataset._validity(start, stop)
    after = _stats_of(dataset)
    delta = None
    if before is not None and after is not None:
        delta = {k: after[k] - before.get(k, 0) for k in after}
    return result, delta


def _run_in_worker(
    kind: str, start: int, stop: int, raw: np.ndarray | None
) -> tuple[Any, dict[str, int] | None]:
    return run_block(_WORKER_DATASET, kind, start, stop, raw)


def open_pool(dataset: Any, workers: int, mp_context: str = "spawn") -> ProcessPoolExecutor:
    """A process pool whose workers each hold a copy of `dataset`."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context(mp_context),
        initializer=_init_worker,
        initargs=(dataset,),
    )


def compute_blocks(
    dataset: Any,
    kind: str,
    blocks: Sequence[tuple[int, int]],
    *,
    workers: int,
    mp_context: str = "spawn",
    pool: ProcessPoolExecutor | None = None,
) -> Iterator[tuple[Any, dict[str, int] | None]]:
    """Yield `run_block(dataset, kind, start, stop)` for each block, in order.

    With `workers=0` blocks are computed here; otherwise in a process pool (`pool`,
    or a new one closed at the end), at most `2 * workers` blocks in flight, results
    yielded in submission order.
    """
    if workers == 0:
        for start, stop in blocks:
            yield run_block(dataset, kind, start, stop)
        return

    def submit(start: int, stop: int) -> Future[Any]:
        raw = raw_indices(dataset, start, stop) if kind == "rows" else None
        return executor.submit(_run_in_worker, kind, start, stop, raw)

    executor = pool if pool is not None else open_pool(dataset, workers, mp_context)
    pending: deque[Future[Any]] = deque()
    try:
        todo = iter(blocks)
        for start, stop in todo:
            pending.append(submit(start, stop))
            if len(pending) >= 2 * workers:
                break
        while pending:
            result = pending.popleft().result()
            nxt = next(todo, None)
            if nxt is not None:
                pending.append(submit(*nxt))
            yield result
    finally:
        for future in pending:
            future.cancel()
        if pool is None:
            executor.shutdown(wait=True, cancel_futures=True)
