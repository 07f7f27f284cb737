"""`RunLifecycle`: the one object that owns a training run, on every backend.

An adapter builds one per run and hands it callables; the lifecycle does the rest, in
the same order everywhere:

- **start** (`start`): the resume policy (restore-or-start, the resume-key check, the
  run state), then the data stream (core batches, or a native iterator positioned by
  the saved state);
- **begin** (`begin`): the preemption handlers, the clocks of `max_time` and
  `Checkpoint(every_n_minutes=...)`, `on_train_start`;
- **the end of each optimizer update** (`end_of_update`): record the steps, surface a
  failed background save, read the signal flag and the clocks, agree with the other
  processes, validate and checkpoint when due (a preemption or the time budget forces
  a checkpoint), and say whether the run is done;
- **finish** (`finish`): wait until every save is durable, restore the handlers, then
  raise `Preempted` or assemble the artifact;
- **abort** (`abort`): always the same: flush and close the writers, let pending saves
  finish, restore the handlers, never mask the original error.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._artifact import TrainingArtifact
from ._checkpointing import Checkpointer, Restored
from ._errors import CheckpointError
from ._plan import Plan, is_core_dataset
from ._preemption import Preempted, SignalFlag
from ._runtime import RunContext

__all__ = ["RunLifecycle", "abort_run", "check_resume_key", "restore_or_start"]

# the flags processes agree on at each boundary (any process → every process)
_STOP, _PREEMPT, _OVER_TIME, _MINUTES = range(4)


def check_resume_key(plan: Plan, meta: Mapping[str, Any], path: str) -> None:
    """Refuse to resume a checkpoint written by a different plan."""
    saved = meta.get("resume_key")
    if not saved:
        return
    current = plan.resume_key()
    diff = sorted(k for k in current if k in saved and saved[k] != current[k])
    if diff:
        detail = "; ".join(f"{k}: checkpoint={saved[k]!r}, now={current[k]!r}" for k in diff)
        raise CheckpointError(
            f"The checkpoint at {path} was written by a different plan ({detail}). "
            "Use a new checkpoint directory, or Checkpoint(resume='never') with an empty one."
        )


def restore_or_start(
    plan: Plan, ckpt: Checkpointer | None, template: Any, ctx: RunContext
) -> tuple[Any, dict[str, Any] | None]:
    """Apply the resume policy; return `(state, data_iter_state)`.

    With `Checkpoint(resume="auto")` the latest complete checkpoint is restored into
    `template` (torn ones are skipped with a warning), its resume key is checked against
    the plan, and `ctx` takes its run state (step, history, callback states); with no
    checkpoint the template is returned. `resume="must"` without a checkpoint raises.
    """
    if ckpt is None or plan.checkpoint is None or plan.checkpoint.resume == "never":
        return template, None
    restored: Restored | None = ckpt.restore_latest(template)
    if restored is None:
        if plan.checkpoint.resume == "must":
            raise CheckpointError(
                f"`Checkpoint.resume='must'` but no complete checkpoint exists in "
                f"{plan.checkpoint.location}. Use resume='auto' to start fresh."
            )
        return template, None
    check_resume_key(plan, restored.meta, restored.path)
    ctx._restore(restored.meta)
    return restored.state, restored.meta.get("data_iter")


def abort_run(ctx: RunContext, ckpt: Checkpointer | None) -> None:
    """After a failure: flush and close the writers, let pending checkpoint writes finish.

    Never raises, so the original error propagates; the last complete checkpoint stays.
    """
    ctx._abort()
    if ckpt is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                ckpt.close()
            except Exception:
                pass


class RunLifecycle:
    """Owns one run: start, the end of each optimizer update, finish, abort.

    Args:
        plan: the frozen plan.
        checkpointer: the backend's checkpoint engine (None: the plan saves nothing).
        fetch: device values → numpy arrays, one call per group (see `RunContext`).
        learning_rate: `() -> float | None`, evaluated only when a callback asks.
        is_chief: whether this process writes metrics (multi-process runs).

    Before the first `end_of_update` the adapter hands over its callables with `bind`.
    """

    def __init__(
        self,
        plan: Plan,
        *,
        checkpointer: Checkpointer | None = None,
        fetch: Callable[[Sequence[Any]], Sequence[Any]] | None = None,
        learning_rate: Callable[[], float | None] | None = None,
        is_chief: bool = True,
    ):
        self.plan = plan
        self.ctx = RunContext(plan, fetch=fetch, learning_rate=learning_rate, is_chief=is_chief)
        self.checkpointer = checkpointer if plan.checkpoint is not None else None
        self._save: Callable[[], Any] | None = None
        self._validate: Callable[[], Any] = lambda: None
        self._agree: Callable[[Sequence[bool]], Sequence[bool]] | None = None
        self._signals = SignalFlag(plan.preemption_signals)
        self._began = False
        self._t0 = time.monotonic()
        self._last_save_t = self._t0
        self._saved_step: int | None = None
        self._preempted_by: str | None = None
        self._preempted = False

    # -- what the adapter hands over ----------------------------------------------------
    def bind(
        self,
        *,
        save: Callable[[], Any] | None,
        validate: Callable[[], Any],
        agree: Callable[[Sequence[bool]], Sequence[bool]] | None = None,
    ) -> None:
        """Hand over the adapter's callables.

        Args:
            save: writes a checkpoint of the current state (`record_checkpoint` with its
                path); None when the plan has no checkpoint. In multi-process runs every
                process calls it at the same step (collective saves).
            validate: runs validation with the current weights (`RunContext.validate`).
            agree: multi-process runs: element-wise "any process" of a list of flags
                (one all-reduce); None for one process.
        """
        self._save = save if self.checkpointer is not None else None
        self._validate = validate
        self._agree = agree

    # -- start --------------------------------------------------------------------------
    @property
    def step(self) -> int:
        """Optimizer steps completed."""
        return self.ctx.step

    @property
    def done(self) -> bool:
        """Whether the run should stop now."""
        return self.ctx._done

    def restore(self, template: Any) -> tuple[Any, dict[str, Any] | None]:
        """The resume policy: `(state, data_iter_state)` (see `restore_or_start`)."""
        return restore_or_start(self.plan, self.checkpointer, template, self.ctx)

    def data_stream(
        self,
        data_state: Mapping[str, Any] | None,
        *,
        shard: tuple[int, int] = (0, 1),
        native: Callable[[Mapping[str, Any] | None], Any] | None = None,
    ) -> Any:
        """The training batches: core batching of `plan.data`, or `native(data_state)`
        (the adapter's iterator over a native loader it accepted)."""
        if is_core_dataset(self.plan.data) or native is None:
            return self.ctx._train_batches(data_state, shard=shard)
        return self.ctx._use_train_iterator(native(data_state))

    def start(
        self,
        template: Any,
        *,
        shard: tuple[int, int] = (0, 1),
        native: Callable[[Mapping[str, Any] | None], Any] | None = None,
    ) -> tuple[Any, Any]:
        """Restore or start, then open the data stream; return `(state, batches)`."""
        state, data_state = self.restore(template)
        return state, self.data_stream(data_state, shard=shard, native=native)

    def begin(self) -> None:
        """Install the preemption handlers, start the clocks, dispatch `on_train_start`."""
        if self._began:
            return
        self._began = True
        self._signals.install()
        self._t0 = self._last_save_t = time.monotonic()
        self.ctx._begin()

    # -- the end of each optimizer update -------------------------------------------------
    def _local_flags(self) -> list[bool]:
        plan, now = self.plan, time.monotonic()
        every = None if plan.checkpoint is None else plan.checkpoint.every_n_minutes
        return [
            self.ctx._stop_reason is not None,
            self._signals.received is not None,
            plan.max_time is not None and now - self._t0 >= plan.max_time,
            every is not None and now - self._last_save_t >= every * 60.0,
        ]

    def end_of_update(self, metrics: Mapping[str, Any], count: int = 1, *, micro: int = 1) -> bool:
        """The sequence after every optimizer update (or group of `count` fused ones).

        Record the steps (callbacks see each one), surface a failed background save,
        agree across processes on stop / preemption / time budget / time cadence,
        validate if due, checkpoint if due or forced, and return whether the run is done.

        Args:
            metrics: the steps' metrics (device values; shape `(count,)` when fused).
            count: how many optimizer steps the call covers.
            micro: batches accumulated per step (metrics then hold `count * micro` values).
        """
        ctx = self.ctx
        if count == 1 and micro == 1:
            ctx._record_step(metrics)
        else:
            ctx._record_steps(metrics, count, micro=micro)
        poll = getattr(self.checkpointer, "poll", None)
        if callable(poll):
            poll()  # raises the error of a failed background save, never blocks
        flags = self._local_flags()
        if self._agree is not None:
            flags = [bool(f) for f in self._agree(flags)]
        if flags[_STOP] and ctx._stop_reason is None:
            ctx._request_stop("a stop was requested on another process")
        forced = preempting = False
        if flags[_PREEMPT] and not self._preempted:
            self._preempted, self._preempted_by = True, self._signals.received
            ctx._request_stop("preempted")
            forced = preempting = True
        elif flags[_OVER_TIME] and ctx._stop_reason is None:
            ctx._request_stop("max_time")
            forced = True
        if ctx._due_validation(at_end=not preempting):
            self._validate()
        if self._save is not None and (ctx._due_checkpoint() or forced or flags[_MINUTES]):
            self._save()
            self._saved_step = ctx.step
            self._last_save_t = time.monotonic()
        return ctx._done

    # -- end ----------------------------------------------------------------------------
    @property
    def preempted(self) -> bool:
        """Whether a preemption signal stopped the run (`finish` raises `Preempted`)."""
        return self._preempted

    def _raise_preempted(self) -> None:
        ckpt = self.checkpointer
        path = None
        if self.plan.checkpoint is not None and self._saved_step == self.ctx.step:
            path = self.plan.checkpoint.step_location(self.ctx.step)
        self.ctx._close_writers()
        if ckpt is not None:
            ckpt.close()
        raise Preempted(self.ctx.step, path, self._preempted_by)

    def settle(self) -> None:
        """Wait until every save is durable; after a preemption restore the handlers and
        raise `Preempted` (for drivers without an end, like `OnlineTrainer`)."""
        if self.checkpointer is not None:
            self.checkpointer.wait()  # raises a failed background save's error
        if self._preempted:
            self._signals.restore()
            self._raise_preempted()

    def finish(
        self, model: Any, *, extra: Mapping[str, Any] | None = None, raw_model: Any = None
    ) -> TrainingArtifact:
        """Wait for durable saves, restore the handlers; raise `Preempted` or return the artifact."""
        ckpt = self.checkpointer
        if not self._began:
            self.begin()
        self.ctx.flush_metrics()
        if ckpt is not None:
            ckpt.wait()  # raises a failed background save's error
        self._signals.restore()
        if self._preempted:
            self._raise_preempted()
        artifact = self.ctx._finish(model, extra=extra, raw_model=raw_model)
        if ckpt is not None:
            ckpt.close()
        return artifact

    def close(self) -> None:
        """Wait for pending saves and restore the handlers (drivers without an end)."""
        self._signals.restore()
        if self.checkpointer is not None:
            self.checkpointer.close()

    def abort(self) -> None:
        """After a failure: flush/close the writers, let pending saves finish, restore the
        handlers. Never raises, so the original error propagates."""
        try:
            self._signals.restore()
        except Exception:
            pass
        abort_run(self.ctx, self.checkpointer)
