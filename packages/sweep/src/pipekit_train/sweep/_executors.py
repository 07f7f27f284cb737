"""Where trials run: in this process, in local worker processes, or as Ray tasks.

Every executor runs `execute_trial(task)` and hands back a JSON outcome (status, artifact
summary, error text); only the parent process writes the journal. An executor has
`submit(task)`, `wait() -> [(task, outcome), ...]` (at least one finished trial),
`cancel()` and `close()`; the sweep keeps at most `max_concurrent` trials in flight.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import multiprocessing
import os
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from pipekit_train.core import ConfigError
from pipekit_train.core.adapter import import_string, optional_import

from ._lifeline import die_with_parent
from ._lock import trial_dir_lock
from ._result import summarize_artifact

__all__ = [
    "EXECUTORS",
    "ProcessExecutor",
    "RayExecutor",
    "SerialExecutor",
    "execute_trial",
    "make_executor",
    "resolve_trial",
    "trial_name",
]

EXECUTORS = ("serial", "process", "ray")


def trial_name(trial: Any, executor: str) -> str | None:
    """The `"module:qualname"` of a trial function, checked importable for `executor`.

    Returns None for a serial sweep whose trial is not importable by name (a lambda or a
    closure runs fine in this process).

    Raises:
        ConfigError: `trial` is not callable, or cannot be imported by name where a
            process or Ray worker has to import it.
    """
    if isinstance(trial, str):
        fn = import_string(trial, field="trial")
        if not callable(fn):
            raise ConfigError(
                f"`trial` must name a function `trial(params) -> TrainingLoop`. "
                f"Received: trial={trial!r}, which is a {type(fn).__name__}."
            )
        name = trial if ":" in trial else ":".join(trial.rsplit(".", 1))
        canonical = _canonical_name(fn)  # the same function named by its defining module
        if canonical is not None:
            name = canonical
        _check_main(name, executor)
        return name
    if not callable(trial):
        raise ConfigError(
            "`trial` must be a function `trial(params) -> TrainingLoop` or its 'module:function' "
            f"name. Received: trial={trial!r}."
        )
    name = _canonical_name(trial)
    if name is not None:
        if executor != "serial":
            _check_main(name, executor)  # type: ignore[arg-type]
        return name
    if executor == "serial":
        return None
    raise ConfigError(
        f"`trial` must be importable by name for executor={executor!r}: each trial runs in a "
        f"worker process that imports it. Received: trial={trial!r}. Define it at module level "
        "in an importable module (not a lambda, closure or notebook cell) and pass it or its "
        "'module:function' name — or use executor='serial'."
    )


def _canonical_name(fn: Any) -> str | None:
    """`"module:qualname"` of `fn` when importing that name gives `fn` back, else None."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        return None
    name = f"{module}:{qualname}"
    try:
        return name if _lookup(name) is fn else None
    except Exception:
        return None


def _check_main(name: str, executor: str) -> None:
    if not name.startswith("__main__:"):
        return
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if executor == "ray" or not main_file:
        where = (
            "Ray workers" if executor == "ray" else "worker processes (this __main__ has no file)"
        )
        raise ConfigError(
            f"`trial` is defined in `__main__`, which {where} cannot import. Received: "
            f"trial={name!r}, executor={executor!r}. Move it into an importable module and pass "
            "its 'module:function' name."
        )


def _lookup(name: str) -> Any:
    module, _, attr = name.partition(":")
    if module == "__main__":
        obj: Any = sys.modules["__main__"]
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj
    return import_string(name, field="trial")


def resolve_trial(trial: Callable[..., Any] | str) -> Callable[..., Any]:
    """The trial function itself (imported when given by name)."""
    return _lookup(trial) if isinstance(trial, str) else trial


def _accepts_trial_dir(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    p = params.get("trial_dir")
    return p is not None and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)


def _failure(exc: BaseException, start: float, tb: str | None = None) -> dict[str, Any]:
    return {
        "status": "failed",
        "summary": {},
        "error": f"{type(exc).__name__}: {exc}",
        "traceback": tb if tb is not None else "".join(traceback.format_exception(exc)),
        "wall_time_s": time.perf_counter() - start,
        "pid": os.getpid(),
    }


def execute_trial(task: dict[str, Any]) -> dict[str, Any]:
    """Build a trial's `TrainingLoop`, stamp it, run it and summarise the artifact.

    Runs in whichever process the executor chose; never raises for a failing trial (the
    outcome says `"failed"`, with the error text and traceback). The loop gets the
    sweep id (`dataclasses.replace(loop.plan, sweep_id=...)`) and, for an Optuna search
    with a pruner, the pruning callback appended to `loop.plan.callbacks`.

    A trial that receives a `trial_dir` owns it while it runs (`trial_dir_lock`): a trial
    whose directory another live process is writing fails with
    `TrialDirectoryInUseError` instead of racing it.
    """
    start = time.perf_counter()
    try:
        fn = resolve_trial(task["trial"])
        owns_dir = bool(task.get("trial_dir")) and _accepts_trial_dir(fn)
        with trial_dir_lock(task["trial_dir"]) if owns_dir else contextlib.nullcontext():
            kwargs = {"trial_dir": Path(task["trial_dir"])} if owns_dir else {}
            artifact, pruning = _run_trial(fn, task, kwargs)
        summary = summarize_artifact(artifact)
    except Exception as exc:
        out = _failure(exc, start)
        if task.get("keep_artifact"):
            out["exception"] = exc
        return out
    out = {
        "status": "pruned" if pruning is not None and pruning.pruned else "ok",
        "summary": summary,
        "error": None,
        "traceback": None,
        "wall_time_s": time.perf_counter() - start,
        "pid": os.getpid(),
    }
    if task.get("keep_artifact"):
        out["artifact"] = artifact
    return out


def _run_trial(
    fn: Callable[..., Any], task: dict[str, Any], kwargs: dict[str, Any]
) -> tuple[Any, Any]:
    """Build the trial's loop, stamp it with the sweep id (and pruning), run it."""
    pruning = None
    loop = fn(dict(task["params"]), **kwargs)
    plan = getattr(loop, "plan", None)
    if (
        plan is None
        or not callable(getattr(loop, "run", None))
        or not dataclasses.is_dataclass(plan)
    ):
        raise ConfigError(
            "`trial(params)` must return a TrainingLoop. "
            f"Received: {type(loop).__name__} from trial={task['trial']!r}."
        )
    callbacks = tuple(plan.callbacks)
    if task.get("pruning"):
        from ._optuna import make_pruning_callback

        pruning = make_pruning_callback(task["pruning"])
        callbacks = (*callbacks, pruning)
    loop.plan = dataclasses.replace(plan, sweep_id=task["sweep_id"], callbacks=callbacks)
    return loop.run(), pruning


class SerialExecutor:
    """Runs each trial in this process, one at a time (live artifacts are kept)."""

    kind = "serial"

    def __init__(self, max_concurrent: int | None = None):
        self.max_concurrent = 1
        self._done: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def submit(self, task: dict[str, Any]) -> None:
        """Run the trial now."""
        self._done.append((task, execute_trial({**task, "keep_artifact": True})))

    def wait(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """The trials finished since the last call."""
        done, self._done = self._done, []
        return done

    @property
    def in_flight(self) -> int:
        """Trials submitted and not yet returned by `wait()`."""
        return len(self._done)

    def cancel(self) -> None:
        """Nothing runs in the background."""

    def close(self) -> None:
        """Nothing to release."""


class ProcessExecutor:
    """Runs trials in a pool of local worker processes started with `spawn`.

    `spawn` (not `fork`) gives each worker a fresh interpreter, which is what jax and
    torch need. Workers are reused from trial to trial, so the framework import is paid
    once per worker. A worker that dies (e.g. killed by the OOM killer) fails the trials
    it was running and the pool is restarted for the rest. Workers die with the sweep:
    if the sweep process is killed, each worker ends within about a second
    (`_lifeline.die_with_parent`), so none keeps training into its trial directory.
    """

    kind = "process"

    def __init__(self, max_concurrent: int | None = None):
        self.max_concurrent = int(max_concurrent or os.cpu_count() or 1)
        self._pool: ProcessPoolExecutor | None = None
        self._futures: dict[Future[Any], dict[str, Any]] = {}

    def _get_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=self.max_concurrent,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=die_with_parent,
                initargs=(os.getpid(),),
            )
        return self._pool

    def submit(self, task: dict[str, Any]) -> None:
        """Queue the trial on a worker."""
        self._futures[self._get_pool().submit(execute_trial, task)] = task

    @property
    def in_flight(self) -> int:
        """Trials submitted and not yet returned by `wait()`."""
        return len(self._futures)

    def wait(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Block until at least one trial finishes; return the finished ones."""
        done, _ = wait(list(self._futures), return_when=FIRST_COMPLETED)
        out = []
        broken = False
        for fut in done:
            task = self._futures.pop(fut)
            start = time.perf_counter()
            try:
                outcome = fut.result()
            except BrokenProcessPool as exc:
                broken = True
                outcome = _failure(
                    RuntimeError(
                        f"the worker process running this trial died unexpectedly ({exc})"
                    ),
                    start,
                    tb="",
                )
            except Exception as exc:  # e.g. a task that could not be pickled
                outcome = _failure(exc, start)
            out.append((task, outcome))
        if broken and self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        return out

    def cancel(self) -> None:
        """Drop queued trials (running ones finish)."""
        for fut in list(self._futures):
            if fut.cancel():
                self._futures.pop(fut)

    def close(self) -> None:
        """Shut the pool down.

        With no trial in flight (a sweep that finished), the idle workers exit in the
        background (jax's teardown takes about a second) and the sweep returns at once;
        otherwise this waits for the running trials.
        """
        if self._pool is not None:
            self._pool.shutdown(wait=bool(self._futures), cancel_futures=True)
            self._pool = None


class RayExecutor:
    """Runs each trial as a Ray task (`num_cpus=1`, no retries).

    Connects to `ray_address` when given; otherwise uses the running Ray runtime, or
    starts a local one (`ray.init()`) and shuts it down again when the sweep ends.
    """

    kind = "ray"

    def __init__(self, max_concurrent: int | None = None, ray_address: str | None = None):
        ray = optional_import("ray", extra="ray", package="pipekit-train-sweep")
        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            ray.init(address=ray_address, include_dashboard=False, log_to_driver=True)
            self._started = True
        cpus = int(ray.cluster_resources().get("CPU", 1)) or 1
        self.max_concurrent = int(max_concurrent or cpus)
        self._remote = ray.remote(num_cpus=1, max_retries=0)(execute_trial)
        self._refs: dict[Any, dict[str, Any]] = {}

    def submit(self, task: dict[str, Any]) -> None:
        """Start the trial as a Ray task."""
        self._refs[self._remote.remote(task)] = task

    @property
    def in_flight(self) -> int:
        """Trials submitted and not yet returned by `wait()`."""
        return len(self._refs)

    def wait(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Block until at least one trial finishes; return the finished ones."""
        ready, _ = self._ray.wait(list(self._refs), num_returns=1)
        out = []
        for ref in ready:
            task = self._refs.pop(ref)
            start = time.perf_counter()
            try:
                outcome = self._ray.get(ref)
            except Exception as exc:  # the task's worker died, or Ray itself failed
                outcome = _failure(exc, start)
            out.append((task, outcome))
        return out

    def cancel(self) -> None:
        """Cancel the trials still running."""
        for ref in list(self._refs):
            try:
                self._ray.cancel(ref, force=True)
            except Exception:
                pass
        self._refs.clear()

    def close(self) -> None:
        """Shut Ray down if this executor started it."""
        if self._started and self._ray.is_initialized():
            self._ray.shutdown()
        self._started = False


def make_executor(kind: str, max_concurrent: int | None, ray_address: str | None) -> Any:
    """Build the executor named `kind`."""
    if kind == "serial":
        return SerialExecutor(max_concurrent)
    if kind == "process":
        return ProcessExecutor(max_concurrent)
    return RayExecutor(max_concurrent, ray_address)
