"""`RunContext`: the machinery every adapter shares.

An adapter reports what happened (`record_step`, `record_steps`, `record_validation`,
`record_checkpoint`) and asks what is due (`due_validation`, `due_checkpoint`, `done`);
the context dispatches callbacks, routes metrics to writers in groups (device values are
fetched to the host only when a callback reads them or a group is flushed), keeps the
history, tracks the best monitored metric, and assembles the `TrainingArtifact`.
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ._artifact import TrainingArtifact
from ._history import History, loss_label
from ._plan import Plan
from ._versions import library_versions

__all__ = ["SKIPPED_METRIC", "RunContext", "RunState", "default_fetch"]

SKIPPED_METRIC = "nonfinite_skipped"
"""Under `on_nonfinite="skip"`: written on each skipped step, the run's skips so far."""

HOOKS = ("on_train_start", "on_step_end", "on_validation_end", "on_checkpoint", "on_train_end")


def default_fetch(values: Sequence[Any]) -> list[np.ndarray]:
    """Bring device values to the host as numpy arrays (one call per group)."""
    return [np.asarray(v) for v in values]


class RunState:
    """The read-only view of a run that callbacks receive."""

    def __init__(self, ctx: RunContext):
        self._ctx = ctx

    @property
    def step(self) -> int:
        """Optimizer steps completed."""
        return self._ctx.step

    @property
    def epoch(self) -> int:
        """The current epoch (0-based)."""
        return self._ctx.epoch

    @property
    def max_steps(self) -> int | None:
        """Total steps of the run, when known."""
        return self._ctx.total_steps

    @property
    def metrics(self) -> dict[str, float]:
        """The latest metrics as host floats (fetches pending device values)."""
        return self._ctx.latest_metrics()

    @property
    def learning_rate(self) -> float | None:
        """The current learning rate, if the backend reports one."""
        return self._ctx.learning_rate()

    @property
    def stop_requested(self) -> bool:
        """Whether a callback asked to stop."""
        return self._ctx.stop_reason is not None

    @property
    def stop_reason(self) -> str | None:
        """Why a callback asked to stop."""
        return self._ctx.stop_reason

    @property
    def is_tty(self) -> bool:
        """Whether stderr is a terminal (progress bars default to on there)."""
        return bool(getattr(sys.stderr, "isatty", lambda: False)())

    @property
    def backend(self) -> str:
        """The backend name."""
        return self._ctx.backend

    @property
    def plan(self) -> dict[str, Any]:
        """The JSON plan."""
        return self._ctx.plan_json

    def log(self, metrics: Mapping[str, float]) -> None:
        """Send extra metrics to the writers at the current step."""
        self._ctx.log(metrics)

    def request_stop(self, reason: str) -> None:
        """Stop training after the current step."""
        self._ctx.request_stop(reason)


class _Normalized:
    """A batch iterator whose batches pass through `normalizer.apply` (state unchanged)."""

    def __init__(self, inner: Any, normalizer: Any):
        self._inner = inner
        self._normalizer = normalizer

    def __iter__(self) -> _Normalized:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        return self._normalizer.apply(next(self._inner))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _PendingGroup:
    """`count` consecutive steps whose metrics are still device values.

    With gradient accumulation each step's metrics arrive as `micro` values (one per
    accumulated batch) and the step's value is their mean.
    """

    __slots__ = ("first_step", "count", "raw", "stacked", "micro", "rows")

    def __init__(
        self, first_step: int, count: int, raw: Mapping[str, Any], stacked: bool, micro: int = 1
    ):
        self.first_step = first_step
        self.count = count
        self.raw = dict(raw)
        self.stacked = stacked
        self.micro = micro
        self.rows: list[dict[str, float]] | None = None

    def to_rows(self, arrays: Mapping[str, np.ndarray]) -> list[dict[str, float]]:
        """Per-step host rows from the fetched arrays."""
        if not self.stacked:
            return [{name: float(arr.reshape(())) for name, arr in arrays.items()}]
        per_step = {
            name: np.asarray(arr, dtype=np.float64).reshape(self.count, self.micro).mean(axis=1)
            for name, arr in arrays.items()
        }
        return [
            {name: float(values[offset]) for name, values in per_step.items()}
            for offset in range(self.count)
        ]


class RunContext:
    """Shared run machinery for adapters (see the module docstring).

    Args:
        plan: the frozen plan.
        fetch: turns a list of device values into numpy arrays in one go (e.g.
            `jax.device_get`); default `np.asarray` on each. Values arrive in step
            order (group by group, metric by metric), so a backend may copy a whole
            group to the host at once.
        learning_rate: `() -> float | None`, evaluated only when a callback asks.
        is_chief: only the chief process writes metrics and dispatches callbacks that
            write files (multi-process runs); every process follows stop requests.
    """

    def __init__(
        self,
        plan: Plan,
        *,
        fetch: Callable[[Sequence[Any]], Sequence[Any]] | None = None,
        learning_rate: Callable[[], float | None] | None = None,
        is_chief: bool = True,
    ):
        self.plan = plan
        self.plan_json = plan.to_json()
        self.backend = plan.backend
        self.step = 0
        self.epoch = 0
        self.stop_reason: str | None = None
        self.resumed_from_step: int | None = None
        self.history = History()
        self._annotate_history()
        self.best_metric: float | None = None
        self.best_step: int | None = None
        self.monitor = plan.checkpoint.monitor if plan.checkpoint else "val_loss"
        self.mode = plan.checkpoint.mode if plan.checkpoint else "min"
        self.is_chief = is_chief
        self._fetch = fetch or default_fetch
        self._lr = learning_rate
        self._pending: list[_PendingGroup] = []
        self._pending_steps = 0
        self._latest: dict[str, float] = {}
        self._writers = list(plan.writers) if is_chief else []
        self._callbacks = list(plan.callbacks)
        if plan.progress or (plan.progress is None and RunState(self).is_tty and is_chief):
            from .callbacks import ProgressBar

            if not any(isinstance(cb, ProgressBar) for cb in self._callbacks):
                self._callbacks.append(ProgressBar())
        self._step_hooks = [
            cb.on_step_end for cb in self._callbacks if callable(getattr(cb, "on_step_end", None))
        ]
        self.state = RunState(self)
        self._t_start = time.perf_counter()
        self._steps_at_start = 0
        self._train_iter: Any = None
        self._last_checkpoint: str | None = None
        self._active: _PendingGroup | None = None
        self.steps_per_epoch: int | None = plan.steps_per_epoch
        self.total_steps: int | None = plan.total_steps
        # on_nonfinite="skip": skips so far, the current run of consecutive ones, the
        # latest skipped step, and a checkpoint postponed from a skipped step
        self.skipped_steps = 0
        self._consecutive_skips = 0
        self._last_skipped: int | None = None
        self._checkpoint_owed = False

    # -- data --------------------------------------------------------------------------
    def train_batches(
        self, data_state: Mapping[str, Any] | None = None, *, shard: tuple[int, int] = (0, 1)
    ) -> Any:
        """The core batch iterator over the training data, positioned by `data_state`.

        `shard=(index, count)`: this process's part of every global batch of
        `plan.batch_size`. The state is global (the same on every process and for every
        process count), so the chief's saved state positions every process, and a run
        checkpointed with one process count resumes with another (elastic resume).
        """
        from .data import make_batches

        it = make_batches(
            self.plan.data,
            self.plan.batch_size,
            seed=self.plan.seed,
            shuffle=self.plan.shuffle,
            drop_remainder=self.plan.drop_remainder,
            shard=shard,
        )
        if data_state:
            it.set_state(data_state)
        self._train_iter = it
        if self.plan.normalizer is not None:
            return _Normalized(it, self.plan.normalizer)
        return it

    def use_train_iterator(self, it: Any) -> Any:
        """Adopt a backend's own training batch iterator (a native loader's batches).

        Its `get_state()` (a JSON-able dict), when it has one, goes into every checkpoint
        (`checkpoint_meta`), so a resume is exact if the backend positions a new iterator
        with it. Without `get_state` a resumed run restarts the loader from its beginning
        (warned here). Returns the iterator to pull batches from (through the plan's
        normalizer, if any).
        """
        self._train_iter = it
        if self.resumed_from_step and not callable(getattr(it, "get_state", None)):
            warnings.warn(
                f"Resuming at step {self.resumed_from_step}, but the training loader "
                f"({type(it).__name__}) has no checkpointable state: it restarts from its "
                "beginning, so the resumed run sees different batches than an uninterrupted one.",
                stacklevel=2,
            )
        if self.plan.normalizer is not None:
            return _Normalized(it, self.plan.normalizer)
        return it

    def _sync_epoch(self) -> None:
        spe = self.steps_per_epoch
        if spe:
            self.epoch = self.step // spe

    # -- lifecycle ---------------------------------------------------------------------
    def restore(self, meta: Mapping[str, Any]) -> None:
        """Load the run state saved in a checkpoint's meta (`checkpoint_meta()`)."""
        run = meta.get("run", {})
        self.step = int(meta.get("step", run.get("step", 0)))
        self.resumed_from_step = self.step
        self._sync_epoch()
        self.history = History.from_json(run.get("history", {}))
        self._annotate_history()
        self.best_metric = run.get("best_metric")
        self.best_step = run.get("best_step")
        self._latest = {k: float(v) for k, v in run.get("latest", {}).items()}
        # a checkpoint is never written right after a skipped step: no run of skips is open
        self.skipped_steps = int(self.history.last(SKIPPED_METRIC) or 0)
        states = run.get("callbacks", {})
        for key, obj in self._stateful():
            if key in states and callable(getattr(obj, "load_state_dict", None)):
                obj.load_state_dict(states[key])

    def _annotate_history(self) -> None:
        """Tell the history what its series mean (loss name, units, backend, run)."""
        plan = self.plan
        if plan.checkpoint is not None:
            run = "/".join(plan.checkpoint.location.rstrip("/").split("/")[-3:])
        else:
            model = self.plan_json.get("model") or {}
            run = str(model.get("factory") or model.get("type") or "")
        if plan.sweep_id:
            run = f"{run} (sweep {plan.sweep_id})" if run else f"sweep {plan.sweep_id}"
        self.history.annotate(
            backend=self.backend,
            loss=loss_label(self.plan_json.get("loss")),
            normalized=plan.normalizer is not None,
            run=run or None,
        )

    def _stateful(self) -> list[tuple[str, Any]]:
        out = []
        for i, obj in enumerate([*self._callbacks, *self._writers]):
            if callable(getattr(obj, "state_dict", None)):
                out.append((f"{i}:{type(obj).__name__}", obj))
        return out

    def begin(self) -> None:
        """Start the clock and dispatch `on_train_start`."""
        self._t_start = time.perf_counter()
        self._steps_at_start = self.step
        self._dispatch("on_train_start")

    @property
    def done(self) -> bool:
        """Whether training should stop now (total steps reached or a stop requested)."""
        total = self.total_steps
        return self.stop_reason is not None or (total is not None and self.step >= total)

    def steps_until_event(self, limit: int) -> int:
        """How many steps may be fused before the next validation/checkpoint/end (≤ limit)."""
        k = limit
        total = self.total_steps
        if total is not None:
            k = min(k, total - self.step)
        ck = self.plan.checkpoint
        if ck is not None:
            k = min(k, ck.every_n_steps - self.step % ck.every_n_steps)
            if self._checkpoint_owed:  # postponed from a skipped step: retry after the next
                k = 1
        if self.plan.validation is not None:
            every = self.plan.validate_every_n_steps or self.steps_per_epoch
            if every:
                k = min(k, every - self.step % every)
        return max(1, k)

    # -- the per-step sequence ----------------------------------------------------------
    def after_steps(
        self,
        metrics: Mapping[str, Any],
        count: int = 1,
        *,
        micro: int = 1,
        validate: Callable[[], Any],
        checkpoint: Callable[[], Any] | None,
        sync_stop: Callable[[bool], bool] | None = None,
    ) -> bool:
        """The sequence after every optimizer step (or group of `count` fused steps).

        Record the steps (callbacks see each one), agree on a stop across processes
        (`sync_stop(requested) -> any process requested`), validate if due, checkpoint if
        due. Every adapter calls this, so the order is the same on every backend.

        Args:
            metrics: the steps' metrics (device values; shape `(count,)` when fused).
            count: how many optimizer steps the call covers.
            micro: batches accumulated per step (metrics then hold `count * micro` values).
            validate: runs validation with the current weights (`RunContext.validate`).
            checkpoint: saves a checkpoint of the current state (None: no checkpoints).
            sync_stop: multi-process runs: all-reduce of "a stop was requested".

        Returns:
            Whether the run is done.
        """
        if count == 1 and micro == 1:
            self.record_step(metrics)
        else:
            self.record_steps(metrics, count, micro=micro)
        if sync_stop is not None and sync_stop(self.stop_reason is not None):
            self.request_stop("a stop was requested on another process")
        if self.due_validation():
            validate()
        if checkpoint is not None and self.due_checkpoint():
            checkpoint()
        return self.done

    # -- metrics -----------------------------------------------------------------------
    def record_step(self, metrics: Mapping[str, Any]) -> None:
        """One optimizer step finished; `metrics` may hold device scalars."""
        self.step += 1
        self._sync_epoch()
        self._pending.append(_PendingGroup(self.step, 1, metrics, stacked=False))
        self._after_steps(1)

    def record_steps(self, stacked: Mapping[str, Any], count: int, *, micro: int = 1) -> None:
        """`count` fused steps finished; each value is a device array of shape `(count,)`.

        With `micro > 1` (gradient accumulation) each value has shape `(count * micro,)`:
        one value per accumulated batch, averaged into the step's value.
        """
        group = _PendingGroup(self.step + 1, count, stacked, stacked=True, micro=micro)
        if self._step_hooks:
            self._active = group
            try:
                for _ in range(count):
                    self.step += 1
                    self._sync_epoch()
                    for hook in self._step_hooks:
                        hook(self.state)
            finally:
                self._active = None
        else:
            self.step += count
            self._sync_epoch()
        self._pending.append(group)
        self._pending_steps += count
        self._maybe_flush()

    def _after_steps(self, count: int) -> None:
        for hook in self._step_hooks:
            hook(self.state)
        self._pending_steps += count
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if self._pending_steps >= self.plan.log_every_n_steps:
            self.flush_metrics()

    def flush_metrics(self) -> None:
        """Fetch every pending device value in one call and write the steps in order."""
        if not self._pending:
            return
        groups, self._pending, self._pending_steps = self._pending, [], 0
        self._fetch_rows(groups)
        policy = self.plan.on_nonfinite
        for group in groups:
            for offset, row in enumerate(group.rows or ()):
                step = group.first_step + offset
                loss = row.get("loss")
                bad = loss is not None and not math.isfinite(loss)
                if policy == "skip" and loss is not None:
                    if bad:  # the backend's step left the state as it was
                        self.skipped_steps += 1
                        self._consecutive_skips += 1
                        self._last_skipped = step
                        row = {**row, SKIPPED_METRIC: float(self.skipped_steps)}
                    else:
                        self._consecutive_skips = 0
                self._write(step, row)
                if not bad or policy == "ignore":
                    continue
                limit = self.plan.max_consecutive_skips
                if policy == "stop" or (limit is not None and self._consecutive_skips >= limit):
                    # every flush comes before a validation or a checkpoint is recorded, so
                    # nothing is ever saved from a state whose history holds this step
                    from .callbacks import NonFiniteLossError

                    streak = self._consecutive_skips if policy == "skip" else None
                    raise NonFiniteLossError(step, "loss", loss, streak)  # type: ignore[arg-type]

    def _fetch_rows(self, groups: Sequence[_PendingGroup]) -> None:
        """Fill `group.rows` for every group that lacks them, with one fetch call."""
        todo = [g for g in groups if g.rows is None]
        keys: list[tuple[int, str]] = []
        values: list[Any] = []
        for gi, group in enumerate(todo):
            for name, value in group.raw.items():
                keys.append((gi, name))
                values.append(value)
        fetched = self._fetch(values) if values else []
        per_group: list[dict[str, np.ndarray]] = [{} for _ in todo]
        for (gi, name), value in zip(keys, fetched, strict=True):
            per_group[gi][name] = np.asarray(value)
        for group, arrays in zip(todo, per_group, strict=True):
            group.rows = group.to_rows(arrays)
            group.raw = {}

    def _write(self, step: int, metrics: Mapping[str, float]) -> None:
        if not metrics:
            return
        self._latest.update(metrics)
        self.history.add(step, metrics)
        for writer in self._writers:
            writer.write(step, metrics)

    def latest_metrics(self) -> dict[str, float]:
        """The latest value of every metric (flushes pending device values first)."""
        self.flush_metrics()
        latest = dict(self._latest)
        active = self._active
        if active is not None:
            self._fetch_rows([active])
            latest.update((active.rows or [{}])[self.step - active.first_step])
        return latest

    def log(self, metrics: Mapping[str, float]) -> None:
        """Write extra host metrics at the current step."""
        self.flush_metrics()
        self._write(self.step, {k: float(v) for k, v in metrics.items()})

    def learning_rate(self) -> float | None:
        """The backend's current learning rate, if it reports one."""
        return None if self._lr is None else self._lr()

    def request_stop(self, reason: str) -> None:
        """Ask the run to stop after the current step."""
        if self.stop_reason is None:
            self.stop_reason = str(reason)

    # -- validation --------------------------------------------------------------------
    def due_validation(self) -> bool:
        """Whether validation is due after the current step."""
        if self.plan.validation is None or self.step == 0:
            return False
        every = self.plan.validate_every_n_steps or self.steps_per_epoch
        if every and self.step % every == 0:
            return True
        return self.done

    def validate(
        self,
        eval_batch: Callable[[dict[str, np.ndarray]], tuple[Any, Any]],
        *,
        batches: Iterable[Mapping[str, np.ndarray]] | None = None,
    ) -> dict[str, float]:
        """Run validation with `eval_batch(batch) -> (pred, mean_loss)` and record it.

        Predictions come back to the host; the loss is averaged weighted by batch size and
        every metric is computed once on the concatenated predictions (numpy).

        Args:
            eval_batch: evaluates one numpy batch with the current weights.
            batches: one pass over the validation batches (a native loader's); None:
                core batches `plan.validation`.
        """
        if batches is None:
            from .data import make_batches

            it: Iterable[Any] = make_batches(
                self.plan.validation,
                self.plan.batch_size,
                seed=self.plan.seed,
                shuffle=False,
                drop_remainder=False,
                num_epochs=1,
            )
        else:
            it = batches
        preds, targets, total, count = [], [], 0.0, 0
        norm = self.plan.normalizer
        for batch in it:
            if norm is not None:
                batch = norm.apply(batch)
            pred, loss = eval_batch(batch)
            n = len(batch["y"])
            total += float(np.asarray(loss)) * n
            count += n
            if self.plan.metrics:
                preds.append(np.asarray(pred))
                targets.append(np.asarray(batch["y"]))
        metrics = {"loss": total / max(count, 1)}
        if self.plan.metrics:
            pred_all, target_all = np.concatenate(preds), np.concatenate(targets)
            for name, fn in self.plan.metrics.items():
                metrics[name] = float(np.asarray(fn(pred_all, target_all)))
        return self.record_validation(metrics)

    def record_validation(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """Record validation metrics (names get a `val_` prefix) and dispatch the hook."""
        self.flush_metrics()
        row = {(k if k.startswith("val_") else f"val_{k}"): float(v) for k, v in metrics.items()}
        self._write(self.step, row)
        value = row.get(self.monitor)
        if value is not None and math.isfinite(value):
            better = self.best_metric is None or (
                value < self.best_metric if self.mode == "min" else value > self.best_metric
            )
            if better:
                self.best_metric, self.best_step = value, self.step
        self._dispatch("on_validation_end")
        return row

    # -- checkpoints -------------------------------------------------------------------
    def due_checkpoint(self) -> bool:
        """Whether a checkpoint is due after the current step."""
        ck = self.plan.checkpoint
        if ck is None:
            return False
        due = ck.due(self.step, final=self.done) or self._checkpoint_owed
        if not due or self.plan.on_nonfinite != "skip":
            return due
        # under "skip", never checkpoint right after a skipped step: postpone to the next
        # step whose loss is finite (so a run stopped by consecutive skips keeps the last
        # checkpoint from before them, and a resume never opens inside a run of skips)
        self.flush_metrics()
        self._checkpoint_owed = self._last_skipped == self.step
        return not self._checkpoint_owed

    def checkpoint_meta(self, data_state: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The JSON saved with every checkpoint: step, data iterator state, run state, plan."""
        self.flush_metrics()
        get_state = getattr(self._train_iter, "get_state", None)
        if data_state is None and callable(get_state):
            data_state = get_state()
        return {
            "step": self.step,
            "epoch": self.epoch,
            "data_iter": None if data_state is None else dict(data_state),
            "run": {
                "step": self.step,
                "history": self.history.to_json(),
                "best_metric": self.best_metric,
                "best_step": self.best_step,
                "latest": self._latest,
                "callbacks": {key: obj.state_dict() for key, obj in self._stateful()},
            },
            "resume_key": self.plan.resume_key(),
            "plan": self.plan_json,
        }

    def checkpoint_metrics(self) -> dict[str, float]:
        """Host metrics for retention decisions (the monitored metric, when known)."""
        return dict(self._latest)

    def record_checkpoint(self, path: str) -> None:
        """A checkpoint was written (or scheduled, for async engines); dispatch the hook."""
        self._last_checkpoint = path
        self._dispatch("on_checkpoint", path)

    # -- end ---------------------------------------------------------------------------
    def _dispatch(self, hook: str, *args: Any) -> None:
        for cb in self._callbacks:
            fn = getattr(cb, hook, None)
            if callable(fn):
                fn(self.state, *args)

    def finish(self, model: Any, *, extra: Mapping[str, Any] | None = None) -> TrainingArtifact:
        """Flush, assemble the artifact, dispatch `on_train_end`, close the writers."""
        self.flush_metrics()
        wall = time.perf_counter() - self._t_start
        ran = self.step - self._steps_at_start
        final = {name: self.history.last(name) for name in self.history.names}
        artifact = TrainingArtifact(
            model=model,
            history=self.history,
            final_metrics={k: v for k, v in final.items() if v is not None},
            best_metric=self.best_metric,
            best_step=self.best_step,
            checkpoint_dir=None if self.plan.checkpoint is None else self.plan.checkpoint.location,
            weights_sha256=TrainingArtifact.hash_weights(model),
            plan=self.plan_json,
            backend=self.backend,
            versions=library_versions(self.backend),
            wall_time_s=wall,
            steps_per_s=ran / wall if wall > 0 else 0.0,
            steps=self.step,
            resumed_from_step=self.resumed_from_step,
            stop_reason=self.stop_reason or "max_steps",
            sweep_id=self.plan.sweep_id,
            normalizer=self.plan.normalizer,
            extra=dict(extra or {}),
        )
        try:
            self._dispatch("on_train_end", artifact)
        finally:
            self.close_writers()
        return artifact

    def close_writers(self) -> None:
        """Flush and close every writer (idempotent)."""
        writers, self._writers = self._writers, []
        errors = []
        for writer in writers:
            try:
                if callable(getattr(writer, "flush", None)):
                    writer.flush()
                if callable(getattr(writer, "close", None)):
                    writer.close()
            except Exception as exc:  # close every writer, then report the first failure
                errors.append(exc)
        if errors:
            raise errors[0]

    def abort(self) -> None:
        """Flush what is pending and close the writers after a failure (never raises)."""
        try:
            self.flush_metrics()
        except Exception:
            pass
        try:
            self.close_writers()
        except Exception:
            pass
