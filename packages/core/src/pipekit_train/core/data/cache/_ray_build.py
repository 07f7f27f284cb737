"""Cache builds on Ray: each chunk is one Ray task that computes it and writes it.

`CachedDataset.build(..., executor="ray")` (or a `RayBuildExecutor`) sends the
dataset to the Ray object store once and runs one task per chunk still to do. The
task computes the chunk's rows, checks them against the element spec, writes them
straight to the store at `uri` (a local path on a one-node runtime or a shared
filesystem, or an object store such as S3) and marks the chunk done, with the same
zarr calls as an in-process build, so the bytes are the same. The driver only
creates the group, merges the sources' counters and commits the build at the end.

Ray is imported when a Ray build starts, never at import time (`pip install
'pipekit-train-core[ray]'`).
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from pipekit_train.core._errors import ConfigError
from pipekit_train.core._imports import optional_import
from pipekit_train.core.data.datasets._dataset import ArraySpec

if TYPE_CHECKING:
    from concurrent.futures import Future

__all__ = ["RayBuildExecutor", "RaySession", "ray_session"]


CANCEL_WAIT_S = 60.0  # how long a failed build waits for its cancelled tasks to end


def _check_amount(name: str, value: Any, *, positive: bool = False) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.integer, np.floating))
        or not np.isfinite(value)
        or value < 0
        or (positive and value == 0)
    ):
        kind = "a positive number" if positive else "a non-negative number"
        raise ConfigError(f"`{name}` must be {kind}. Received: {name}={value!r}.")
    return float(value)


class RayBuildExecutor:
    """Run the chunk builds of `CachedDataset.build` as Ray tasks.

    Pass it as `CachedDataset.build(dataset, uri, executor=RayBuildExecutor(...))`;
    `executor="ray"` is `RayBuildExecutor()`. Each chunk still to do is one task that
    computes the rows and writes them to the store itself, so `uri` must be reachable
    from every Ray node under the same name: an object store (`s3://`, `gs://`) or a
    shared filesystem; a local path only on a one-node runtime.

    Args:
        address: the Ray cluster to connect to (`"auto"`, `"ray://head:10001"`,
            `"10.0.0.1:6379"`). None: the Ray runtime already initialised in this
            process, else the cluster in `RAY_ADDRESS`, else a new local runtime that
            is shut down when the build ends. A runtime already initialised in this
            process is always used as is.
        num_cpus: CPUs each chunk task requests.
        num_gpus: GPUs each chunk task requests (fractions allowed).
        resources: custom Ray resources each task requests, e.g. `{"simulator": 1}`.
        max_in_flight: chunk tasks submitted at a time. None: twice the cluster's
            CPUs divided by `num_cpus` (at least 1).
        max_retries: times Ray re-runs a chunk task whose worker process died (a
            crash, a lost node); chunk writes are idempotent, so a retry is safe.
            Exceptions raised by the dataset are not retried: they fail the build.
        runtime_env: the Ray runtime environment, e.g. `{"working_dir": ".",
            "pip": ["pipekit-train-core[s3]"]}` so that remote nodes can import the
            simulator. Set on the Ray job when the build connects to Ray itself; with
            a runtime already initialised in this process it is set per task, where
            Ray accepts only remote URIs for `working_dir` and `py_modules` (pass
            local ones to your own `ray.init`).

    Raises:
        ConfigError: an option is invalid.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        num_cpus: float = 1,
        num_gpus: float = 0,
        resources: Mapping[str, float] | None = None,
        max_in_flight: int | None = None,
        max_retries: int = 3,
        runtime_env: Mapping[str, Any] | None = None,
    ) -> None:
        if address is not None and (not isinstance(address, str) or not address):
            raise ConfigError(
                "`address` must be a Ray address such as 'auto' or 'ray://head:10001', or "
                f"None. Received: address={address!r}."
            )
        self.address = address
        self.num_cpus = _check_amount("num_cpus", num_cpus)
        self.num_gpus = _check_amount("num_gpus", num_gpus)
        if resources is not None and not isinstance(resources, Mapping):
            raise ConfigError(
                f"`resources` must be a dict of resource name to amount. "
                f"Received: resources={resources!r}. Use e.g. resources={{'simulator': 1}}."
            )
        self.resources = {
            str(k): _check_amount(f"resources[{k!r}]", v) for k, v in (resources or {}).items()
        }
        if max_in_flight is not None and (
            isinstance(max_in_flight, bool)
            or not isinstance(max_in_flight, (int, np.integer))
            or max_in_flight < 1
        ):
            raise ConfigError(
                "`max_in_flight` must be a positive int or None. "
                f"Received: max_in_flight={max_in_flight!r}."
            )
        self.max_in_flight = None if max_in_flight is None else int(max_in_flight)
        if (
            isinstance(max_retries, bool)
            or not isinstance(max_retries, (int, np.integer))
            or max_retries < 0
        ):
            raise ConfigError(
                f"`max_retries` must be a non-negative int. Received: max_retries={max_retries!r}."
            )
        self.max_retries = int(max_retries)
        if runtime_env is not None and not isinstance(runtime_env, Mapping):
            raise ConfigError(
                f"`runtime_env` must be a dict or None. Received: runtime_env={runtime_env!r}."
            )
        self.runtime_env = None if runtime_env is None else dict(runtime_env)

    def task_options(self, *, with_runtime_env: bool) -> dict[str, Any]:
        """The `ray.remote(...).options(...)` of a chunk task."""
        options: dict[str, Any] = {
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "max_retries": self.max_retries,
            "retry_exceptions": False,
        }
        if self.resources:
            options["resources"] = dict(self.resources)
        if with_runtime_env and self.runtime_env is not None:
            options["runtime_env"] = dict(self.runtime_env)
        return options

    def __repr__(self) -> str:
        return (
            f"RayBuildExecutor(address={self.address!r}, num_cpus={self.num_cpus:g}, "
            f"num_gpus={self.num_gpus:g}, resources={self.resources!r}, "
            f"max_in_flight={self.max_in_flight!r}, max_retries={self.max_retries})"
        )


# -- functions that run in Ray workers (module level: imported by name there) -----------
def _call_with_dataset(dataset: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """Run a worker function of `_workers` with `dataset` as the worker's dataset."""
    from pipekit_train.core.data.datasets._workers import _init_worker

    _init_worker(dataset)
    return fn(*args)


def _build_chunk(
    dataset: Any,
    uri: str,
    storage_options: Mapping[str, Any] | None,
    spec: Mapping[str, ArraySpec],
    cid: int,
    start: int,
    stop: int,
    raw: np.ndarray | None,
) -> dict[str, int] | None:
    """Compute chunk `cid` (rows `start:stop`), write it to the cache and mark it done."""
    from pipekit_train.core.data.datasets._workers import run_block

    from ._write_chunk import check_batch, open_chunk_arrays, write_chunk
    from ._zarr_store import open_store, zarr_module

    batch, delta = run_block(dataset, "rows", start, stop, raw)
    check_batch(batch, spec, start, stop)
    store = open_store(uri, storage_options, read_only=False)
    group = zarr_module().open_group(store, mode="r+")
    arrays, done = open_chunk_arrays(group, spec)
    write_chunk(arrays, done, batch, cid, start, stop)
    return delta


# -- the driver side ---------------------------------------------------------------------
class _RayPool:
    """The `submit` of a process pool, on Ray (for `SimulationDataset.scan`)."""

    def __init__(self, session: RaySession) -> None:
        self._session = session
        self._remote = session.remote(_call_with_dataset)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        ref = self._remote.remote(self._session.dataset_ref, fn, *args)
        future: Future[Any] = ref.future()
        return future


class RaySession:
    """A Ray runtime for one build, with the dataset in the object store."""

    def __init__(
        self, ray: Any, executor: RayBuildExecutor, dataset: Any, *, job_env: bool = False
    ) -> None:
        self.ray = ray
        self.executor = executor
        self._task_env = not job_env  # the runtime_env is the job's, or set per task
        try:
            self.dataset_ref = ray.put(dataset)
        except Exception as exc:
            raise ConfigError(
                "executor='ray' sends the dataset to Ray workers, so Ray must be able to "
                f"serialize it. Received: a dataset that cannot be serialized ({exc}). Define "
                "the simulator and sampler at module level, or use executor='process'."
            ) from exc
        self.cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._check_resources()

    def _check_resources(self) -> None:
        available = self.ray.cluster_resources()
        wanted = {"CPU": self.executor.num_cpus, "GPU": self.executor.num_gpus}
        wanted.update(self.executor.resources)
        missing = {k: v for k, v in wanted.items() if v > available.get(k, 0.0)}
        if missing:
            warnings.warn(
                f"The Ray cluster has {dict(available)!r}, but each chunk task requests "
                f"{missing!r}: tasks wait until an autoscaler adds such nodes.",
                RuntimeWarning,
                stacklevel=4,
            )

    def remote(self, fn: Callable[..., Any]) -> Any:
        """`fn` as a Ray task with the executor's options."""
        options = self.executor.task_options(with_runtime_env=self._task_env)
        return self.ray.remote(fn).options(**options)

    def pool(self) -> _RayPool:
        """A process-pool-like `submit` for `SimulationDataset.scan`."""
        return _RayPool(self)

    @property
    def workers(self) -> int:
        """The parallelism to plan for: tasks that fit the cluster at once."""
        return max(1, int(self.cpus / max(self.executor.num_cpus, 1e-9)))

    def write_chunks(
        self,
        uri: str,
        storage_options: Mapping[str, Any] | None,
        meta: Mapping[str, Any],
        spec: Mapping[str, ArraySpec],
        todo: list[int],
        raw_indices: Callable[[int, int], np.ndarray | None],
        on_done: Callable[[dict[str, int] | None], None],
    ) -> None:
        """Run one chunk task per chunk in `todo`; `on_done(delta)` as each one ends.

        On the first failure the other tasks are cancelled, and the error is raised once
        they have ended (chunks already written stay done: the next build resumes after
        them).
        """
        ray = self.ray
        n, cs = meta["num_samples"], meta["chunk_size"]
        remote = self.remote(_build_chunk)
        limit = self.executor.max_in_flight or 2 * self.workers
        pending: dict[Any, int] = {}

        def submit(cid: int) -> None:
            start, stop = cid * cs, min(n, (cid + 1) * cs)
            ref = remote.remote(
                self.dataset_ref,
                uri,
                dict(storage_options) if storage_options else None,
                dict(spec),
                cid,
                start,
                stop,
                raw_indices(start, stop),
            )
            pending[ref] = cid

        todo_iter = iter(todo)
        try:
            for cid in itertools.islice(todo_iter, limit):
                submit(cid)
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    pending.pop(ref)
                    on_done(ray.get(ref))
                    nxt = next(todo_iter, None)
                    if nxt is not None:
                        submit(nxt)
        finally:
            for ref in pending:
                try:
                    ray.cancel(ref)
                except Exception:  # already finished or gone: nothing to cancel
                    pass
            if pending:
                # A cancel only asks: a task in the middle of its chunk may still finish
                # and mark it done. Wait until every task has ended, so that when the build
                # raises, the cache is in its final state (no task of it writes any more)
                # and a rerun recomputes exactly the chunks that are not done.
                ray.wait(list(pending), num_returns=len(pending), timeout=CANCEL_WAIT_S)


@contextmanager
def ray_session(executor: RayBuildExecutor, dataset: Any) -> Iterator[RaySession]:
    """Connect to (or start) Ray for one build; shut down a runtime started here."""
    ray = optional_import("ray", extra="ray", package="pipekit-train-core")
    started = False
    if not ray.is_initialized():
        ray.init(
            address=executor.address, runtime_env=executor.runtime_env, include_dashboard=False
        )
        started = True
    try:
        yield RaySession(ray, executor, dataset, job_env=started)
    finally:
        if started and ray.is_initialized():
            ray.shutdown()
