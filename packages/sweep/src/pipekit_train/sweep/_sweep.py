"""`HyperSweep`: run many `TrainingLoop` trials, in parallel, resumably, and rank them."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import tempfile
import time
import uuid
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pipekit_train.core import ConfigError
from pipekit_train.core.utils import optional_import, write_atomic

from ._axes import describe_axes
from ._executors import Executor, ProcessExecutor, make_executor, trial_name
from ._grid import ParameterGrid, check_params
from ._journal import Journal, params_key
from ._lock import sweep_dir_lock
from ._optuna import OptunaSearch
from ._result import SweepResult, TrialFailedError, TrialResult, metric_value

__all__ = ["HyperSweep", "load_result"]

logger = logging.getLogger("pipekit_train.sweep")

_MODES = ("min", "max")


def _static_space(space: Any) -> list[dict[str, Any]]:
    if isinstance(space, Mapping):
        raise ConfigError(
            "`search_space` is a dict; a search space is an iterable of parameter dicts. "
            f"Received: search_space={space!r}. Wrap a grid in ParameterGrid({{...}})."
        )
    if isinstance(space, (str, bytes)) or not isinstance(space, Iterable):
        raise ConfigError(
            "`search_space` must be a ParameterGrid, an OptunaSearch or an iterable of parameter "
            f"dicts. Received: search_space={space!r}."
        )
    items = [check_params(p, where=f"search_space[{i}]") for i, p in enumerate(space)]
    if not items:
        raise ConfigError("`search_space` is empty. Received: 0 parameter sets. Give at least one.")
    seen: set[str] = set()
    unique = []
    for params in items:
        key = params_key(params)
        if key in seen:
            continue
        seen.add(key)
        unique.append(params)
    if len(unique) < len(items):
        warnings.warn(
            f"`search_space` repeats {len(items) - len(unique)} parameter set(s); each distinct set "
            "runs once.",
            UserWarning,
            stacklevel=3,
        )
    return unique


def _write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True).encode())


def load_result(directory: str | os.PathLike[str]) -> SweepResult:
    """Read a sweep's result from its directory (journal + `sweep.json`) without running it."""
    directory = Path(directory)
    meta_path = directory / "sweep.json"
    if not meta_path.exists():
        raise ConfigError(
            f"No sweep in this directory (no sweep.json). Received: directory={str(directory)!r}."
        )
    meta = json.loads(meta_path.read_text())
    latest: dict[Any, dict[str, Any]] = {}
    for record in Journal(directory / "journal.jsonl").read():
        latest[record["index"] if meta.get("adaptive") else record["key"]] = record
    trials = sorted((TrialResult.from_json(r) for r in latest.values()), key=lambda t: t.index)
    return SweepResult(
        meta["sweep_id"],
        meta["metric"],
        meta["mode"],
        trials,
        str(directory),
        axes=dict(meta.get("axes") or {}),
    )


class HyperSweep:
    """Run one `TrainingLoop` per parameter set and rank the trials by a metric.

    A `StatefulOperator`: `run()` advances the sweep (running the trials its journal does
    not hold yet) and returns a `SweepResult`. Every trial is recorded in an append-only
    journal under `directory` as soon as it finishes, so a sweep that is killed and run
    again skips the finished trials and ends with the same result.

    Each trial: `loop = trial(params)` (plus `trial_dir=<directory>/trials/<key>` when the
    function accepts a `trial_dir` keyword — a per-trial folder for checkpoints, so a
    trial killed half-way resumes from its own checkpoint), then the sweep sets
    `loop.plan = dataclasses.replace(loop.plan, sweep_id=..., callbacks=...)` (the
    Optuna pruning callback, if any, is appended) and calls `loop.run()`. The metric is
    `artifact.final_metrics[metric]`, or `artifact.best_metric` when `metric` is the
    monitored one and not among the final metrics.

    Args:
        trial: `trial(params) -> TrainingLoop`, or its `"module:function"` name. With
            `executor="process"` or `"ray"` it must be importable by name (module level,
            not a lambda or closure), because each worker imports it.
        search_space: a `ParameterGrid`, any iterable of parameter dicts (JSON values),
            or an `OptunaSearch`.
        metric: the metric to rank by (e.g. `"val_loss"`, `"val_mae"`, `"loss"`).
        mode: `"min"` or `"max"`.
        executor: `"serial"` (this process, one trial at a time; trials keep their live
            artifact), `"process"` (a pool of `spawn`ed local processes) or `"ray"` (one
            Ray task per trial), or an executor with settings:
            `ProcessExecutor(devices=["cuda:0", "cuda:1"], trials_per_device=2)`,
            `RayExecutor(resources_per_trial={"num_cpus": 1, "num_gpus": 0.5})`.
        max_concurrent: trials in flight at once (default: 1 serial; CPU count for
            processes, or every device slot with `devices`; for Ray, the trials that fit
            on the cluster's nodes at once).
        directory: the sweep directory (journal, `sweep.json`, `trials/`, `optuna.db`).
            Default: a new temporary directory, which a re-run does not find — pass a
            directory to make the sweep resumable.
        fail_fast: stop at the first failed trial (after the ones in flight finish) and
            raise `TrialFailedError`. By default a failing trial is recorded as failed
            with its error and the sweep goes on.
        sweep_id: stamped on every trial and `TrainingArtifact` (default: the id in
            `directory/sweep.json`, else a new random id).
        ray_address: the Ray cluster to connect to (`executor="ray"`); default: the running
            Ray runtime or a new local one. (`RayExecutor(address=...)` does the same.)
        retry_failed: run trials the journal records as failed again.

    Raises:
        ConfigError: any invalid argument, before any work is done.
    """

    def __init__(
        self,
        trial: Callable[..., Any] | str,
        search_space: Any,
        metric: str,
        mode: str = "min",
        *,
        executor: str | Executor = "serial",
        max_concurrent: int | None = None,
        directory: str | os.PathLike[str] | None = None,
        fail_fast: bool = False,
        sweep_id: str | None = None,
        ray_address: str | None = None,
        retry_failed: bool = False,
    ):
        runner = make_executor(executor, ray_address)
        kind = runner.kind
        if not isinstance(metric, str) or not metric:
            raise ConfigError(
                f"`metric` must be a metric name such as 'val_loss'. Received: metric={metric!r}."
            )
        if mode not in _MODES:
            raise ConfigError(f"`mode` must be 'min' or 'max'. Received: mode={mode!r}.")
        if max_concurrent is not None and (
            isinstance(max_concurrent, bool)
            or not isinstance(max_concurrent, int)
            or max_concurrent < 1
        ):
            raise ConfigError(
                f"`max_concurrent` must be a positive int or None. Received: max_concurrent={max_concurrent!r}."
            )
        if kind == "serial" and max_concurrent not in (None, 1):
            raise ConfigError(
                "The serial executor runs one trial at a time. Received: "
                f"max_concurrent={max_concurrent}. Use executor='process' or 'ray' to run trials in parallel."
            )
        for flag, value in (("fail_fast", fail_fast), ("retry_failed", retry_failed)):
            if not isinstance(value, bool):
                raise ConfigError(f"`{flag}` must be True or False. Received: {flag}={value!r}.")
        if sweep_id is not None and (not isinstance(sweep_id, str) or not sweep_id.strip()):
            raise ConfigError(
                f"`sweep_id` must be a non-empty string. Received: sweep_id={sweep_id!r}."
            )
        slots = runner.slots if isinstance(runner, ProcessExecutor) else None
        if (
            isinstance(runner, ProcessExecutor)
            and slots is not None
            and max_concurrent is not None
            and max_concurrent > slots
        ):
            raise ConfigError(
                f"At most {slots} trials run at once on {len(runner.devices)} device(s) with "
                f"trials_per_device={runner.trials_per_device}. Received: "
                f"max_concurrent={max_concurrent}. Lower it, or raise trials_per_device."
            )
        if directory is not None and not isinstance(directory, (str, os.PathLike)):
            raise ConfigError(f"`directory` must be a path. Received: directory={directory!r}.")
        self._trial_name = trial_name(trial, kind)
        self.trial = trial
        self.adaptive = isinstance(search_space, OptunaSearch)
        self.search_space = search_space
        self._params = None if self.adaptive else _static_space(search_space)
        if kind == "ray":
            optional_import("ray", extra="ray", package="pipekit-train-sweep")
        self.metric = metric
        self.mode = mode
        self.executor = kind
        self._executor = runner
        self.max_concurrent = max_concurrent
        self.directory = None if directory is None else Path(directory)
        self.fail_fast = fail_fast
        self.retry_failed = retry_failed
        self.ray_address = ray_address
        self._sweep_id = sweep_id
        self.result: SweepResult | None = None

    @property
    def sweep_id(self) -> str | None:
        """The sweep id (known after `run()` when not given)."""
        return self._sweep_id

    def get_config(self) -> dict[str, Any]:
        """A JSON description of the sweep."""
        if self.adaptive:
            space: Any = self.search_space.describe()
        elif isinstance(self.search_space, ParameterGrid):
            space = {
                "type": "ParameterGrid",
                "size": len(self.search_space),
                "repr": repr(self.search_space),
            }
        else:
            space = {"type": "list", "size": len(self._params or [])}
        return {
            "trial": self._trial_name,
            "search_space": space,
            "metric": self.metric,
            "mode": self.mode,
            "executor": self.executor,
            "executor_settings": self._executor.describe(),
            "max_concurrent": self.max_concurrent,
            "directory": None if self.directory is None else str(self.directory),
            "fail_fast": self.fail_fast,
            "sweep_id": self._sweep_id,
        }

    def _axes(self) -> dict[str, dict[str, Any]]:
        """How each parameter is plotted (log/linear/categorical), from the search space."""
        return describe_axes(self.search_space)

    # -- run ------------------------------------------------------------------------------
    def run(self) -> SweepResult:
        """Run the trials the journal does not hold yet and return the ranked result.

        Raises:
            TrialFailedError: a trial failed and `fail_fast=True`.
            ConfigError: the metric is not among a finished trial's metrics (the error
                names the available ones), or the directory holds a different sweep.
        """
        if self.executor == "process" and getattr(
            multiprocessing.current_process(), "_inheriting", False
        ):
            raise RuntimeError(
                "HyperSweep.run() was called while a worker process imported the main module. "
                "With executor='process' the script's entry point must be guarded by "
                "`if __name__ == '__main__':` (worker processes are started with 'spawn')."
            )
        start = time.perf_counter()
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="pipekit-sweep-"))
        directory = self.directory
        directory.mkdir(parents=True, exist_ok=True)
        with sweep_dir_lock(directory):
            journal = Journal(directory / "journal.jsonl")
            journal.repair()
            records = journal.read()
            meta = self._check_directory(directory, bool(records))
            executor = self._executor
            executor.start(self.max_concurrent)  # before sweep.json: a refused start leaves none
            try:
                sweep_id = self._write_meta(directory, meta)
                state = _RunState(self, directory, journal, sweep_id, executor)
                if self.adaptive:
                    trials = state.run_adaptive(records)
                else:
                    trials = state.run_static(records)
            finally:
                executor.close()
        result = SweepResult(
            sweep_id, self.metric, self.mode, trials, str(directory), axes=self._axes()
        )
        result.wall_time_s = time.perf_counter() - start
        self.result = result
        return result

    def _check_directory(self, directory: Path, has_records: bool) -> dict[str, Any] | None:
        """The directory's `sweep.json`, checked to describe this sweep when it has results."""
        meta_path = directory / "sweep.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else None
        if meta and has_records:
            expected = {"metric": self.metric, "mode": self.mode, "adaptive": self.adaptive}
            if self._trial_name and meta.get("trial"):
                expected["trial"] = self._trial_name
            if self._sweep_id is not None:
                expected["sweep_id"] = self._sweep_id
            diff = {k: (meta.get(k), v) for k, v in expected.items() if meta.get(k) != v}
            if diff:
                detail = ", ".join(
                    f"{k}={old!r} there, {new!r} now" for k, (old, new) in diff.items()
                )
                raise ConfigError(
                    f"The directory holds a different sweep ({detail}). Received: directory="
                    f"{str(directory)!r}. Use the same settings to resume it, or a new directory."
                )
        return meta

    def _write_meta(self, directory: Path, meta: dict[str, Any] | None) -> str:
        """Write `sweep.json` (keeping its sweep id and creation time); return the sweep id."""
        meta_path = directory / "sweep.json"
        sweep_id = self._sweep_id or (meta or {}).get("sweep_id") or uuid.uuid4().hex[:12]
        self._sweep_id = sweep_id
        _write_json_atomic(
            meta_path,
            {
                "sweep_id": sweep_id,
                "trial": self._trial_name,
                "metric": self.metric,
                "mode": self.mode,
                "adaptive": self.adaptive,
                "search_space": self.get_config()["search_space"],
                "axes": self._axes(),
                "created": (meta or {}).get("created", time.strftime("%Y-%m-%dT%H:%M:%S%z")),
            },
        )
        return sweep_id


class _RunState:
    """One `run()` call: submits trials, records outcomes, applies the stop rules."""

    def __init__(
        self, sweep: HyperSweep, directory: Path, journal: Journal, sweep_id: str, executor: Any
    ):
        self.sweep = sweep
        self.directory = directory
        self.journal = journal
        self.sweep_id = sweep_id
        self.executor = executor
        self.stopping: BaseException | None = None
        # Serial trials run in this process (any callable works); workers import by name.
        self.trial_ref = sweep.trial if sweep.executor == "serial" else sweep._trial_name

    def _task(
        self, index: int, params: dict[str, Any], key: str, trial_dir: Path, pruning: Any = None
    ) -> dict[str, Any]:
        return {
            "trial": self.trial_ref,
            "params": params,
            "index": index,
            "key": key,
            "sweep_id": self.sweep_id,
            "trial_dir": str(trial_dir),
            "pruning": pruning,
        }

    def _record(self, task: Mapping[str, Any], outcome: Mapping[str, Any]) -> TrialResult | None:
        sweep = self.sweep
        status = outcome["status"]
        summary = dict(outcome.get("summary") or {})
        value = metric_value(summary, sweep.metric) if status != "failed" else None
        if status == "ok" and value is None:
            available = sorted(summary.get("final_metrics") or {})
            if self.stopping is None:
                self.stopping = ConfigError(
                    f"The sweep metric is not among the trial's metrics. Received: metric={sweep.metric!r}; "
                    f"available: {available}. Use one of them (validation metrics are prefixed 'val_'; "
                    "add `validation=` to the trial's loop for them)."
                )
            return None
        result = TrialResult(
            index=int(task["index"]),
            key=str(task["key"]),
            params=dict(task["params"]),
            status=status,
            value=value,
            error=outcome.get("error"),
            summary=summary,
            wall_time_s=float(outcome.get("wall_time_s", 0.0)),
            sweep_id=self.sweep_id,
            trial_dir=task.get("trial_dir"),
            traceback=outcome.get("traceback"),
            artifact=outcome.get("artifact"),
        )
        self.journal.append(
            {**result.to_json(), "pid": outcome.get("pid"), "finished_at": time.time()}
        )
        shown = "" if value is None else f" {sweep.metric}={value:.6g}"
        logger.info(
            "trial %d %s%s (%.2fs) params=%s",
            result.index,
            status,
            shown,
            result.wall_time_s,
            result.params,
        )
        if status == "failed":
            logger.warning("trial %d failed: %s", result.index, result.error)
            if sweep.fail_fast and self.stopping is None:
                exc = TrialFailedError(
                    f"Trial {result.index} failed and fail_fast=True. Received: params={result.params}. "
                    f"Error: {result.error}",
                    result,
                )
                cause = outcome.get("exception")
                if cause is not None:
                    exc.__cause__ = cause
                self.stopping = exc
        return result

    def _drain(self, on_result: Callable[[Mapping[str, Any], TrialResult | None], None]) -> None:
        for task, outcome in self.executor.wait():
            on_result(task, self._record(task, outcome))

    def run_static(self, records: list[dict[str, Any]]) -> list[TrialResult]:
        params_list = self.sweep._params or []
        keys = [params_key(p) for p in params_list]
        wanted = set(keys)
        done: dict[str, TrialResult] = {}
        for record in records:
            if record["key"] in wanted:
                done[record["key"]] = TrialResult.from_json(record)
        if self.sweep.retry_failed:
            done = {k: t for k, t in done.items() if t.status != "failed"}
        pending = deque(
            (i, p, k)
            for i, (p, k) in enumerate(zip(params_list, keys, strict=True))
            if k not in done
        )
        if done:
            logger.info(
                "resuming sweep %s: %d of %d trials already finished",
                self.sweep_id,
                len(done),
                len(keys),
            )

        def on_result(task: Mapping[str, Any], result: TrialResult | None) -> None:
            if result is not None:
                done[result.key] = result

        try:
            while pending or self.executor.in_flight:
                while (
                    pending
                    and self.stopping is None
                    and self.executor.in_flight < self.executor.max_concurrent
                ):
                    index, params, key = pending.popleft()
                    self.executor.submit(
                        self._task(index, params, key, self.directory / "trials" / key)
                    )
                if not self.executor.in_flight:
                    break
                self._drain(on_result)
        except BaseException:
            self.executor.cancel()
            raise
        if self.stopping is not None:
            raise self.stopping
        by_key = {k: i for i, k in enumerate(keys)}
        trials = sorted(done.values(), key=lambda t: by_key[t.key])
        for t in trials:
            t.index = by_key[t.key]  # the position in this search space
        return trials

    def run_adaptive(self, records: list[dict[str, Any]]) -> list[TrialResult]:
        search: OptunaSearch = self.sweep.search_space
        search._open(
            directory=self.directory,
            sweep_id=self.sweep_id,
            metric=self.sweep.metric,
            mode=self.sweep.mode,
            executor=self.sweep.executor,
        )
        done: dict[int, TrialResult] = {}
        for record in records:
            done[int(record["index"])] = TrialResult.from_json(record)
        search._recover({i: t.to_json() for i, t in done.items()})
        if self.sweep.retry_failed:
            done = {i: t for i, t in done.items() if t.status != "failed"}

        def on_result(task: Mapping[str, Any], result: TrialResult | None) -> None:
            status = "failed" if result is None else result.status
            search._tell(int(task["index"]), status, None if result is None else result.value)
            if result is not None:
                done[result.index] = result

        try:
            while True:
                while (
                    self.stopping is None
                    and len(done) + self.executor.in_flight < search.n_trials
                    and self.executor.in_flight < self.executor.max_concurrent
                ):
                    number, params, pruning = search._ask()
                    key = params_key(params)
                    trial_dir = self.directory / "trials" / f"{number:05d}-{key}"
                    self.executor.submit(self._task(number, params, key, trial_dir, pruning))
                if not self.executor.in_flight:
                    break
                self._drain(on_result)
        except BaseException:
            self.executor.cancel()
            search._close()
            raise
        if self.stopping is not None:
            raise self.stopping
        return sorted(done.values(), key=lambda t: t.index)
