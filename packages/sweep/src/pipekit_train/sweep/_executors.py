"""Where trials run: in this process, in local worker processes, or as Ray tasks.

Every executor runs `execute_trial(task)` and hands back a JSON outcome (status, artifact
summary, error text); only the parent process writes the journal. An executor is built
with its settings (validated at once, nothing started) and has `start(max_concurrent)`,
`submit(task)`, `wait() -> [(task, outcome), ...]` (at least one finished trial),
`cancel()` and `close()`; the sweep keeps at most `max_concurrent` trials in flight. An
executor can run one sweep at a time, and again after `close()`.
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
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from pipekit_train.core import ConfigError
from pipekit_train.core.utils import import_string, optional_import

from ._lifeline import die_with_parent
from ._lock import trial_dir_lock
from ._resources import check_devices, check_resources, jax_memory_defaults, trials_that_fit
from ._result import summarize_artifact

__all__ = [
    "EXECUTORS",
    "Executor",
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
    found = _canonical_name(trial)
    if found is not None:
        if executor != "serial":
            _check_main(found, executor)
        return found
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
        or not dataclasses.is_dataclass(type(plan))  # (the type: `plan` stays untyped)
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
    """Runs each trial in this process, one at a time (live artifacts are kept).

    `HyperSweep(..., executor="serial")` (the default) uses one.
    """

    kind = "serial"

    def __init__(self) -> None:
        self.max_concurrent = 1
        self._done: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def describe(self) -> dict[str, Any]:
        """The executor's settings as JSON."""
        return {"kind": self.kind}

    def start(self, max_concurrent: int | None = None) -> None:
        """Nothing to start (one trial at a time)."""
        self._done = []

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


def _start_worker(parent_pid: int, env: dict[str, str]) -> None:
    """A process-executor worker's first act: its device's environment, then the lifeline."""
    os.environ.update(env)
    die_with_parent(parent_pid)


class ProcessExecutor:
    """Runs trials in local worker processes started with `spawn`, optionally one device each.

    `spawn` (not `fork`) gives each worker a fresh interpreter, which is what jax and
    torch need. Workers are reused from trial to trial, so the framework import is paid
    once per worker. A worker that dies (e.g. killed by the OOM killer) fails the trials
    it was running and its pool is restarted for the rest. Workers die with the sweep:
    if the sweep process is killed, each worker ends within about a second
    (`_lifeline.die_with_parent`), so none keeps training into its trial directory.

    With `devices`, every device gets its own `trials_per_device` workers, so at most
    that many trials run on a device at once. Each worker's environment is set for its
    device before it imports anything of the trial: `CUDA_VISIBLE_DEVICES` (a trial on
    `"cuda:1"` sees that GPU as its only one, `cuda:0` inside the trial),
    `PIPEKIT_SWEEP_DEVICE` (the device as listed) and, when several trials share a
    GPU, `XLA_PYTHON_CLIENT_MEM_FRACTION` (JAX's 75% preallocation divided between
    them, unless a JAX memory variable is already set).

    Args:
        devices: None (plain workers, `max_concurrent` of them), or a list of
            `"cuda:<i>"`, `"cuda:<i>,<j>"` (several GPUs per trial), `"cpu"` (GPUs
            hidden) or dicts of environment variables (e.g. `{"HIP_VISIBLE_DEVICES": "0"}`).
        trials_per_device: trials that share one device at a time.

    Raises:
        ConfigError: a malformed device or count (see `check_devices`).
    """

    kind = "process"

    def __init__(self, devices: Sequence[Any] | None = None, *, trials_per_device: int = 1):
        self.devices = check_devices(devices, trials_per_device)
        self.trials_per_device = trials_per_device
        self.max_concurrent = 0
        self._pools: dict[int, ProcessPoolExecutor] = {}
        self._futures: dict[Future[Any], tuple[dict[str, Any], int]] = {}

    @property
    def slots(self) -> int | None:
        """Trials that can run at once with `devices` (None without devices)."""
        return len(self.devices) * self.trials_per_device if self.devices else None

    def describe(self) -> dict[str, Any]:
        """The executor's settings as JSON."""
        out: dict[str, Any] = {"kind": self.kind}
        if self.devices:
            out["devices"] = [d.label for d in self.devices]
            out["trials_per_device"] = self.trials_per_device
        return out

    def start(self, max_concurrent: int | None = None) -> None:
        """Set the number of trials in flight (workers start with the first trials)."""
        if max_concurrent is not None and self.slots is not None and max_concurrent > self.slots:
            raise ConfigError(
                f"At most {self.slots} trials run at once on {len(self.devices)} device(s) with "
                f"trials_per_device={self.trials_per_device}. Received: "
                f"max_concurrent={max_concurrent}. Lower it, or raise trials_per_device."
            )
        self.max_concurrent = int(max_concurrent or self.slots or os.cpu_count() or 1)

    def _env(self, slot: int) -> dict[str, str]:
        if not self.devices:
            return {}
        device = self.devices[slot]
        env = {**device.env, "PIPEKIT_SWEEP_DEVICE": device.label}
        if device.env.get("CUDA_VISIBLE_DEVICES"):
            env.update(jax_memory_defaults(1 / self.trials_per_device))
        return env

    def _pool(self, slot: int) -> ProcessPoolExecutor:
        pool = self._pools.get(slot)
        if pool is None:
            pool = self._pools[slot] = ProcessPoolExecutor(
                max_workers=self.trials_per_device if self.devices else self.max_concurrent,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(os.getpid(), self._env(slot)),
            )
        return pool

    def _free_slot(self) -> int:
        """The device with the fewest trials in flight (the first of equals)."""
        if not self.devices:
            return 0
        busy = [0] * len(self.devices)
        for _, slot in self._futures.values():
            busy[slot] += 1
        return busy.index(min(busy))

    def submit(self, task: dict[str, Any]) -> None:
        """Queue the trial on a worker (of the least busy device)."""
        if not self.max_concurrent:
            self.start()
        slot = self._free_slot()
        self._futures[self._pool(slot).submit(execute_trial, task)] = (task, slot)

    @property
    def in_flight(self) -> int:
        """Trials submitted and not yet returned by `wait()`."""
        return len(self._futures)

    def wait(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Block until at least one trial finishes; return the finished ones."""
        done, _ = wait(list(self._futures), return_when=FIRST_COMPLETED)
        out = []
        broken: set[int] = set()
        for fut in done:
            task, slot = self._futures.pop(fut)
            start = time.perf_counter()
            try:
                outcome = fut.result()
            except BrokenProcessPool as exc:
                broken.add(slot)
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
        for slot in broken:
            pool = self._pools.pop(slot, None)
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        return out

    def cancel(self) -> None:
        """Drop queued trials (running ones finish)."""
        for fut in list(self._futures):
            if fut.cancel():
                self._futures.pop(fut)

    def close(self) -> None:
        """Shut the pools down.

        With no trial in flight (a sweep that finished), the idle workers exit in the
        background (jax's teardown takes about a second) and the sweep returns at once;
        otherwise this waits for the running trials.
        """
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            pool.shutdown(wait=bool(self._futures), cancel_futures=True)
        self._futures.clear()
        self.max_concurrent = 0


def _ray_trial(task: dict[str, Any], gpu_share: float) -> dict[str, Any]:
    """A trial in a Ray worker: JAX's GPU memory share for a fractional GPU, then the trial."""
    for name, value in jax_memory_defaults(gpu_share).items():
        os.environ.setdefault(name, value)
    return execute_trial(task)


class RayExecutor:
    """Runs each trial as a Ray task with the resources one trial needs (no retries).

    Ray places each trial on a node with `resources_per_trial` free and runs as many
    at once as the cluster holds: with `{"num_gpus": 0.5}`, two trials share each GPU;
    with `{"resources": {"bigmem": 1}}`, trials run only on nodes started with that
    custom resource. A trial with GPUs sees them as Ray assigns them
    (`CUDA_VISIBLE_DEVICES`, `ray.get_gpu_ids()`; trials sharing a GPU see the same
    one) and runs in a fresh worker process (Ray does not reuse GPU workers). With a
    fraction of a GPU, `XLA_PYTHON_CLIENT_MEM_FRACTION` is set to that fraction of
    JAX's 75% preallocation, unless a JAX memory variable is already set.

    Connects to `address` when given; otherwise uses the running Ray runtime, or
    starts a local one (`ray.init()`) and shuts it down again when the sweep ends. If
    the sweep's driver dies, Ray ends its trials (Ray's job fate sharing).

    Args:
        resources_per_trial: Ray task options for each trial: `num_cpus` (default 1),
            `num_gpus` (a fraction below 1 shares a GPU; above 1, whole GPUs),
            `memory` (bytes), `resources` (custom resources, `{"name": amount}`),
            `accelerator_type` (e.g. `"H100"`, with `num_gpus`).
        address: the Ray cluster to connect to (e.g. `"ray://head:10001"` or
            `"auto"`); default: the running Ray runtime or a new local one.

    Raises:
        ConfigError: an invalid resource request (see `check_resources`); when the sweep
            starts, a request no node of the cluster can meet (unless the sweep sets
            `max_concurrent`, e.g. for a cluster that scales up).
    """

    kind = "ray"

    def __init__(
        self, resources_per_trial: Mapping[str, Any] | None = None, *, address: str | None = None
    ):
        self.options = check_resources(resources_per_trial)
        if address is not None and (not isinstance(address, str) or not address.strip()):
            raise ConfigError(
                "`address` must be a Ray cluster address such as 'ray://head:10001' or 'auto'. "
                f"Received: address={address!r}."
            )
        self.address = address
        self.max_concurrent = 0
        self._ray: Any = None
        self._started = False
        self._ray_trial_fn: Any = None
        self._refs: dict[Any, dict[str, Any]] = {}

    def describe(self) -> dict[str, Any]:
        """The executor's settings as JSON."""
        return {"kind": self.kind, "resources_per_trial": self.options, "address": self.address}

    def start(self, max_concurrent: int | None = None) -> None:
        """Connect to (or start) Ray and count how many trials the cluster runs at once.

        Raises:
            ConfigError: no node can run a trial and `max_concurrent` is not given.
        """
        ray = optional_import("ray", extra="ray", package="pipekit-train-sweep")
        self._ray = ray
        if not ray.is_initialized():
            ray.init(address=self.address, include_dashboard=False, log_to_driver=True)
            self._started = True
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        fit = trials_that_fit(self.options, nodes)
        if fit == 0 and max_concurrent is None:
            self.close()
            raise ConfigError(
                "No node of the Ray cluster can run a trial. Received: "
                f"resources_per_trial={self.options}; the nodes have "
                f"{[_node_summary(n) for n in nodes]}. Ask for less, add nodes with these "
                "resources, or pass max_concurrent to the sweep to wait for nodes that a "
                "scaling cluster adds."
            )
        if fit is None:  # nothing requested: the cluster's CPUs
            fit = int(ray.cluster_resources().get("CPU", 1)) or 1
        self.max_concurrent = int(max_concurrent or fit)
        self._ray_trial_fn = ray.remote(max_retries=0, **self.options)(_ray_trial)

    def submit(self, task: dict[str, Any]) -> None:
        """Start the trial as a Ray task."""
        if self._ray_trial_fn is None:
            self.start()
        ref = self._ray_trial_fn.remote(task, float(self.options.get("num_gpus", 0)))
        self._refs[ref] = task

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
        if self._started and self._ray is not None and self._ray.is_initialized():
            self._ray.shutdown()
        self._started = False
        self._ray_trial_fn = None
        self._refs.clear()
        self.max_concurrent = 0


def _node_summary(resources: Mapping[str, float]) -> dict[str, float]:
    """A node's resources without Ray's bookkeeping entries (node ids, memory sizes)."""
    skip = ("node:", "memory", "object_store_memory")
    return {
        name: float(amount)
        for name, amount in sorted(resources.items())
        if not name.startswith(skip) and name != "memory"
    }


Executor = SerialExecutor | ProcessExecutor | RayExecutor


def make_executor(executor: str | Executor, ray_address: str | None = None) -> Executor:
    """The executor for `HyperSweep(executor=...)`: a name, or an executor as given.

    Raises:
        ConfigError: an unknown name, or `ray_address` with anything but the Ray executor.
    """
    if isinstance(executor, (SerialExecutor, ProcessExecutor, RayExecutor)):
        if ray_address is not None:
            raise ConfigError(
                "Give the Ray address once. Received: ray_address="
                f"{ray_address!r} with executor={type(executor).__name__}(...). Pass "
                "RayExecutor(address=...) instead."
            )
        return executor
    if not isinstance(executor, str) or executor not in EXECUTORS:
        raise ConfigError(
            f"`executor` must be one of {list(EXECUTORS)} or an executor such as "
            f"RayExecutor(resources_per_trial=...). Received: executor={executor!r}."
        )
    if ray_address is not None and executor != "ray":
        raise ConfigError(
            f"`ray_address` is used by the Ray executor only. Received: ray_address={ray_address!r}, "
            f"executor={executor!r}. Pass executor='ray'."
        )
    if executor == "serial":
        return SerialExecutor()
    if executor == "process":
        return ProcessExecutor()
    return RayExecutor(address=ray_address)
