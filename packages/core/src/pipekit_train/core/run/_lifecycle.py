"""`RunLifecycle`: the one object that owns a training run, on every backend.

An adapter builds one per run (`with RunLifecycle(...) as run:` — leaving the block by an
exception aborts the run), hands it callables with `bind`, and the lifecycle does the
rest, in the same order everywhere:

- **the lease** (on construction): one run per checkpoint location — the chief takes the
  location's lease (`RunLease`, a new generation fenced at the newest committed step)
  before any other work, so a second run on the location is
  refused at once (in a multi-process run every process agrees on the refusal at
  `begin`); it is released by `finish`, `abort` and a preemption;
- **start** (`start`): the resume policy (restore-or-start, the resume-key check, the
  run state), then the data stream: a `Feed` over core batching (or the adapter's
  native iterator, positioned by the saved state) that knows the data position after
  every batch handed out;
- **begin** (`begin`): in a multi-process run, agreement that every process starts at
  the same step; the preemption handlers, the clocks of `max_time` and
  `Checkpoint(every_n_minutes=...)`, the learning-rate scale, `on_train_start`;
- **the end of each optimizer update** (`end_of_update`): record the steps, surface a
  failed background save, read the signal flag and the clocks, agree with the other
  processes, validate and checkpoint when due (a preemption or the time budget forces
  a checkpoint, and so does a validation that improved the monitored metric of a run
  with `restore_best`), and say whether the run is done. Validation chooses core or native
  batches and runs the adapter's batch evaluator inside the adapter's scope;
  a checkpoint composes its metadata (run state, the position after the last batch
  trained on), has the engine save the adapter's state and records it;
- **the weights of the result** (`final_state`): the last state, or with
  `restore_best` the best checkpoint's, restored by the engine as a resume restores;
- **finish** (`finish`): wait until every save is durable (in a multi-process run every
  process waits for the chief's, so none starts a next run from an older checkpoint),
  restore the handlers, then
  raise `Preempted` or assemble the artifact;
- **abort** (`abort`): always the same: flush and close the writers, let pending saves
  finish, restore the handlers, never mask the original error.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from pipekit_train.core._errors import CheckpointError
from pipekit_train.core.artifact._artifact import TrainingArtifact
from pipekit_train.core.checkpoint._engine import Checkpointer, Restored
from pipekit_train.core.checkpoint._lease import (
    LeaseError,
    RunLease,
    _failpoint,
    plan_fingerprint,
    read_lease,
)
from pipekit_train.core.checkpoint._store import open_store
from pipekit_train.core.data import is_core_dataset
from pipekit_train.core.spec._plan import Plan

from ._context import RunContext
from ._feed import Feed
from ._preemption import Preempted, SignalFlag

__all__ = ["RunLifecycle", "check_resume_key"]

# the flags processes agree on at each boundary (any process → every process)
_STOP, _PREEMPT, _OVER_TIME, _MINUTES = range(4)
_STEP_BITS = 48  # the start step, agreed bit by bit (`_agree_on_step`)


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


class RunLifecycle:
    """Owns one run: start, the end of each optimizer update, finish, abort.

    Args:
        plan: the frozen plan.
        checkpointer: the backend's checkpoint engine (None: the plan saves nothing). An
            engine whose `collective` attribute is true is called on every process of a
            multi-process run (its save is a collective operation); otherwise only the
            chief writes and the other processes record the same path.
        fetch: device values → numpy arrays, one call per group.
        learning_rate: `() -> float | None`, evaluated only when a callback asks.
        is_chief: whether this process writes metrics and checkpoints (multi-process
            runs: global rank 0).
        durable_saves: every save waits until it is durable (drivers without an end,
            such as `OnlineTrainer`, where no `finish` waits for them).
        processes: how many processes the run has. With one, a refused lease raises
            here; with more, the processes agree on it (every one raises) in `restore`
            when `agree` is given here, else at `begin`.
        agree: multi-process runs: element-wise "any process" of a list of flags, when
            the processes can already communicate (else bound later with `bind`).

    Raises:
        LeaseError: another run holds the checkpoint location (one process).

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
        durable_saves: bool = False,
        processes: int = 1,
        agree: Callable[[Sequence[bool]], Sequence[bool]] | None = None,
    ):
        self.plan = plan
        self._lease: RunLease | None = None
        self._refused: LeaseError | None = None
        self._lease_agreed = False
        policy = plan.checkpoint
        if checkpointer is not None and policy is not None and policy.lease_timeout is not None:
            if is_chief:  # before any other work: a refused run does nothing
                lease = RunLease(
                    policy,
                    plan_fingerprint(plan.resume_key()),
                    committed=lambda: open_store(policy).latest_committed(),
                )
                try:
                    lease.acquire()
                except LeaseError as err:
                    if processes <= 1:
                        with contextlib.suppress(Exception):
                            checkpointer.close()
                        raise
                    self._refused = err  # every process raises at `begin`
                else:
                    self._lease = lease
        try:
            self._setup(plan, checkpointer, fetch, learning_rate, is_chief, durable_saves)
            self._agree: Callable[[Sequence[bool]], Sequence[bool]] | None = agree
        except BaseException:
            self._release()
            raise

    def _setup(
        self,
        plan: Plan,
        checkpointer: Checkpointer | None,
        fetch: Callable[[Sequence[Any]], Sequence[Any]] | None,
        learning_rate: Callable[[], float | None] | None,
        is_chief: bool,
        durable_saves: bool,
    ) -> None:
        self._durable = bool(durable_saves)
        self.ctx = RunContext(plan, fetch=fetch, learning_rate=learning_rate, is_chief=is_chief)
        self.checkpointer = checkpointer if plan.checkpoint is not None else None
        self.feed: Feed | None = None
        self._consumed = 0  # batches trained on in this run (the data position)
        self._state: Callable[[], Any] | None = None
        self._eval_batch: Callable[[Any], tuple[Any, Any]] | None = None
        self._eval_batches: Callable[[Any], Iterable[Mapping[str, Any]]] | None = None
        self._eval_scope: Callable[[], contextlib.AbstractContextManager[Any]] = (
            contextlib.nullcontext
        )
        self._validate: Callable[[], Any] | None = None
        self._data_state: Callable[[], Mapping[str, Any] | None] | None = None
        self._signals = SignalFlag(plan.preemption_signals)
        self._began = False
        self._t0 = time.monotonic()
        self._last_save_t = self._t0
        self._saved_step: int | None = None
        self._preempted_by: str | None = None
        self._preempted = False
        self._weights_step: int | None = None  # set by `final_state`

    # -- the session ----------------------------------------------------------------------
    def __enter__(self) -> RunLifecycle:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.abort()

    # -- what the adapter hands over ----------------------------------------------------
    def bind(
        self,
        *,
        state: Callable[[], Any] | None = None,
        eval_batch: Callable[[Any], tuple[Any, Any]] | None = None,
        eval_batches: Callable[[Any], Iterable[Mapping[str, Any]]] | None = None,
        eval_scope: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
        validate: Callable[[], Any] | None = None,
        data_state: Callable[[], Mapping[str, Any] | None] | None = None,
        lr_scale: Callable[[float], None] | None = None,
        agree: Callable[[Sequence[bool]], Sequence[bool]] | None = None,
    ) -> None:
        """Hand over the adapter's callables (each optional).

        Args:
            state: `() -> state` the checkpoint engine saves (called at every save, on
                every process: it may gather across processes).
            eval_batch: `batch -> (predictions, mean loss)` with the current weights, for
                validation (numpy batch dicts in, predictions back to the host).
            eval_batches: `validation -> batches`: one pass over a native validation
                loader as numpy batch dicts (core datasets are batched by core).
            eval_scope: `() -> context manager` around a validation pass (eval mode, the
                moving average swapped in, a state sync).
            validate: a whole validation of the adapter's own, instead of the above.
            data_state: `() -> position` to save, for a native loader the framework
                iterates itself; by default the feed's position after the last batch
                trained on.
            lr_scale: `scale -> None` applying core's learning-rate scale to the step
                (used when a callback adjusts the rate).
            agree: multi-process runs: element-wise "any process" of a list of flags
                (one all-reduce); None for one process.
        """
        self._state = state
        self._eval_batch = eval_batch
        self.ctx.predict = self._predict if eval_batch is not None else None
        self._eval_batches = eval_batches
        if eval_scope is not None:
            self._eval_scope = eval_scope
        self._validate = validate
        self._data_state = data_state
        if agree is not None:
            self._agree = agree
        self.ctx.lr_scale.bind(lr_scale)

    # -- where the run is ---------------------------------------------------------------
    @property
    def step(self) -> int:
        """Optimizer steps completed."""
        return self.ctx.progress.step

    @property
    def total_steps(self) -> int | None:
        """The steps the run trains in all, when known."""
        return self.ctx.progress.total_steps

    @property
    def is_chief(self) -> bool:
        """Whether this process writes metrics and checkpoints."""
        return self.ctx.is_chief

    @property
    def done(self) -> bool:
        """Whether the run should stop now."""
        return self.ctx.progress.done

    @property
    def preempted(self) -> bool:
        """Whether a preemption signal stopped the run (`finish` raises `Preempted`)."""
        return self._preempted

    @property
    def adjusts_lr(self) -> bool:
        """Whether a callback of the plan changes the learning rate (the step needs a scale)."""
        return self.ctx.lr_scale.enabled

    def steps_until_event(self, limit: int) -> int:
        """How many steps may be fused before the next validation, checkpoint or end."""
        return self.ctx.checkpoints.steps_until_event(limit)

    # -- start --------------------------------------------------------------------------
    def restore(self, template: Any) -> tuple[Any, dict[str, Any] | None]:
        """Apply the resume policy; return `(state, data_iter_state)`.

        With `Checkpoint(resume="auto")` the latest complete checkpoint is restored into
        `template` (torn ones are skipped with a warning), its resume key is checked
        against the plan, and the run takes its state (step, history, callback states);
        with no checkpoint the template is returned. `resume="must"` without a checkpoint
        raises.
        """
        plan, ckpt = self.plan, self.checkpointer
        if ckpt is None or plan.checkpoint is None or plan.checkpoint.resume == "never":
            return template, None
        if self._agree is not None:
            self._agree_on_lease()  # before reading: every process raises together
        elif self._refused is not None:
            return template, None  # another run's location: `begin` raises on every process
        restored: Restored | None = ckpt.restore_latest(template)
        if restored is None:
            if plan.checkpoint.resume == "must":
                raise CheckpointError(
                    f"`Checkpoint.resume='must'` but no complete checkpoint exists in "
                    f"{plan.checkpoint.location}. Use resume='auto' to start fresh."
                )
            return template, None
        check_resume_key(plan, restored.meta, restored.path)
        self.ctx.restore(restored.meta)
        return restored.state, restored.meta.get("data_iter")

    def data_stream(
        self,
        data_state: Mapping[str, Any] | None,
        *,
        shard: tuple[int, int] = (0, 1),
        native: Callable[[Mapping[str, Any] | None], Any] | None = None,
        track: bool = True,
    ) -> Feed:
        """The training batches: core batching of `plan.data`, or `native(data_state)`
        (the adapter's iterator over a native loader it accepted), as a `Feed`.

        Args:
            data_state: the saved position (a resume), or None.
            shard: `(index, count)` of this process's part of every global batch.
            native: builds the iterator over a native loader.
            track: the consumer reads ahead of training (see `Feed`).
        """
        ctx = self.ctx
        if is_core_dataset(self.plan.data) or native is None:
            batches = ctx.train_batches(data_state, shard=shard)
        else:
            batches = ctx.adopt_train_iterator(native(data_state))
        self.feed = Feed(batches, track=track)
        self._consumed = 0
        return self.feed

    def start(
        self,
        template: Any,
        *,
        shard: tuple[int, int] = (0, 1),
        native: Callable[[Mapping[str, Any] | None], Any] | None = None,
        track: bool = True,
    ) -> tuple[Any, Feed]:
        """Restore or start, then open the data stream; return `(state, feed)`."""
        state, data_state = self.restore(template)
        return state, self.data_stream(data_state, shard=shard, native=native, track=track)

    def begin(self) -> None:
        """Install the preemption handlers, start the clocks, dispatch `on_train_start`."""
        if self._began:
            return
        self._began = True
        self._agree_on_lease()
        self._agree_on_step()
        self._signals.install()
        self._t0 = self._last_save_t = time.monotonic()
        self.ctx.begin()

    def _agree_on_lease(self) -> None:
        """Multi-process runs: every process raises if the chief was refused the lease."""
        if self._lease_agreed:
            return
        self._lease_agreed = True
        if self._agree is None or self.checkpointer is None or self.plan.checkpoint is None:
            if self._refused is not None:
                raise self._refused
            return
        if self.plan.checkpoint.lease_timeout is None:
            return
        (refused,) = self._agree([self._refused is not None])
        if self._refused is not None:
            raise self._refused
        if refused:
            holder = read_lease(self.plan.checkpoint)
            who = f" ({holder.describe()})" if holder is not None else ""
            raise LeaseError(
                f"Received: checkpoint={self.plan.checkpoint.location!r}, but another run "
                f"holds it{who}: this job's first process was refused its lease. Stop that "
                "run, or pass a different checkpoint location."
            )

    def _agree_on_step(self) -> None:
        """Multi-process runs: every process raises if they start from different steps.

        Processes that restored different checkpoints would issue different collectives
        and wait on each other for ever; two flag reductions at the start turn that into
        an error on every process.
        """
        if self._agree is None:
            return
        step = self.ctx.progress.step
        bits = [bool(step >> k & 1) for k in range(_STEP_BITS)]
        union = [bool(b) for b in self._agree(bits)]
        (differ,) = self._agree([union != bits])
        if differ:
            raise CheckpointError(
                f"Received: this process starts at step {step}, but another process of the "
                "run starts at a different step: they restored different checkpoints of "
                f"{self.plan.checkpoint.location if self.plan.checkpoint else 'the run'}. "
                "Give every process the same checkpoint location and let the previous run "
                "end on every process before starting this one."
            )

    def _wait_for_saves(self) -> None:
        """Wait until every save is durable; in a multi-process run, on every process.

        No process leaves the run before the chief's last checkpoint is complete (one that
        left early could start its next run from an older checkpoint than the chief's);
        a failed save raises on every process.
        """
        ckpt = self.checkpointer
        if ckpt is None:
            return
        error: BaseException | None = None
        try:
            ckpt.wait()  # raises a failed background save's error
        except Exception as err:
            if self._agree is None:
                raise
            error = err
        if self._agree is None:
            return
        (failed,) = self._agree([error is not None])
        if error is not None:
            raise error
        if failed:
            raise CheckpointError(
                "Another process of this run failed to write a checkpoint (its error is in "
                "that process's log); this process stops with it."
            )

    def _release(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()

    # -- the end of each optimizer update -------------------------------------------------
    def boundary_flags(self) -> list[bool]:
        """This run's step-boundary flags before any agreement: `[stop requested,
        preemption signal received, time budget spent, time-cadence checkpoint due]`."""
        plan, now = self.plan, time.monotonic()
        every = None if plan.checkpoint is None else plan.checkpoint.every_n_minutes
        return [
            self.ctx.progress.stop_reason is not None,
            self._signals.received is not None,
            plan.max_time is not None and now - self._t0 >= plan.max_time,
            every is not None and now - self._last_save_t >= every * 60.0,
        ]

    def end_of_update(
        self,
        metrics: Mapping[str, Any],
        count: int = 1,
        *,
        micro: int = 1,
        epoch: int | None = None,
        flags: Sequence[bool] | None = None,
    ) -> bool:
        """The sequence after every optimizer update (or group of `count` fused ones).

        Record the steps (callbacks see each one), surface a failed background save,
        agree across processes on stop / preemption / time budget / time cadence,
        validate if due, checkpoint if due or forced, and return whether the run is done.

        Args:
            metrics: the steps' metrics (device values; shape `(count,)` when fused).
            count: how many optimizer steps the call covers (each consumed
                `plan.accumulate_grad_batches` batches).
            micro: values per step in `metrics` (accumulated batches reported one by
                one; 1 when the backend reports one value per step).
            epoch: the framework's epoch, for a native loader of unknown length.
            flags: the step-boundary flags (`boundary_flags`) already agreed by a driver
                that runs several lifecycles in lockstep (the members of a `SeedGroup`
                stop, checkpoint and are preempted together); None: this run's own,
                agreed across processes when `agree` is bound.
        """
        ctx = self.ctx
        progress = ctx.progress
        self._consumed += count * self.plan.accumulate_grad_batches
        if epoch is not None and progress.steps_per_epoch is None:
            progress.epoch = int(epoch)
        if count == 1 and micro == 1:
            ctx.metrics.record_step(metrics)
        else:
            ctx.metrics.record_steps(metrics, count, micro=micro)
        poll = getattr(self.checkpointer, "poll", None)
        if callable(poll):
            poll()  # raises the error of a failed background save, never blocks
        if flags is not None:
            flags = [bool(f) for f in flags]
        else:
            flags = self.boundary_flags()
            if self._agree is not None:
                flags = [bool(f) for f in self._agree(flags)]
        if flags[_STOP] and progress.stop_reason is None:
            progress.request_stop("a stop was requested on another process")
        forced = preempting = False
        if flags[_PREEMPT] and not self._preempted:
            self._preempted, self._preempted_by = True, self._signals.received
            progress.request_stop("preempted")
            forced = preempting = True
        elif flags[_OVER_TIME] and progress.stop_reason is None:
            progress.request_stop("max_time")
            forced = True
        validated = ctx.validation.due(at_end=not preempting)
        if validated:
            self.validate()
        best = validated and self._improved_now()
        if self.checkpointer is not None and (
            ctx.checkpoints.due(best=best) or forced or flags[_MINUTES]
        ):
            self.save()
        return progress.done

    def _improved_now(self) -> bool:
        """With `restore_best`: whether this step's validation improved the monitored
        metric, so its weights are saved now (every process agrees)."""
        if not self.plan.restore_best or self.checkpointer is None:
            return False
        improved = self.ctx.validation.best_step == self.ctx.progress.step
        if self._agree is not None:
            (improved,) = self._agree([improved])
        return bool(improved)

    # -- validation and checkpoints -----------------------------------------------------
    def validate(self) -> None:
        """Validate with the current weights: the adapter's own validation, or its batch
        evaluator over core batches (or the native loader's) inside its scope."""
        if self._validate is not None:
            self._validate()
            return
        if self._eval_batch is None:
            raise RuntimeError(
                "The adapter bound no `eval_batch` (or `validate`), so the run cannot "
                "validate. An adapter bug: RunLifecycle.bind(eval_batch=...)."
            )
        validation = self.plan.validation
        batches = None
        if not is_core_dataset(validation):
            if self._eval_batches is None:
                raise RuntimeError(
                    "The adapter bound no `eval_batches` for its native validation loader "
                    f"({type(validation).__name__}). An adapter bug."
                )
            batches = self._eval_batches(validation)
        eval_batch, predict = self._eval_batch, self.ctx.predict
        with self._eval_scope():
            # inside the scope already: a callback's `state.predict` calls the evaluator
            self.ctx.predict = lambda batch: np.asarray(eval_batch(batch)[0])
            try:
                self.ctx.validation.run(eval_batch, batches=batches)
            finally:
                self.ctx.predict = predict

    def _predict(self, batch: Mapping[str, Any]) -> Any:
        """The model's predictions for one numpy batch (in the model's units) with the
        current weights: the validation evaluator, inside its scope."""
        assert self._eval_batch is not None
        with self._eval_scope():
            pred, _ = self._eval_batch(batch)
        return np.asarray(pred)

    def record_validation(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """Record validation metrics the framework computed itself (names get `val_`)."""
        return self.ctx.validation.record(metrics)

    def _data_position(self) -> Mapping[str, Any] | None:
        if self._data_state is not None:
            return self._data_state()
        if self.feed is None:
            return None
        return self.feed.state_after(self._consumed)

    def save(self) -> str:
        """Checkpoint the current step now (a background write may still be in flight).

        Every process calls it at the same step in multi-process runs: the state callable
        runs everywhere; the chief (or every process, for a collective engine) writes.
        """
        ckpt, ctx = self.checkpointer, self.ctx
        if ckpt is None or self.plan.checkpoint is None:
            raise CheckpointError("This run has no `checkpoint=Checkpoint(...)` to save to.")
        if self._state is None:
            raise RuntimeError(
                "The adapter bound no `state` to checkpoint. An adapter bug: "
                "RunLifecycle.bind(state=...)."
            )
        state = self._state()
        step = ctx.progress.step
        if self._lease is not None:
            self._lease.check()  # a run that lost its location never writes into it
            _failpoint("save:checked")
        if ctx.is_chief or getattr(ckpt, "collective", False):
            schedule = ctx.checkpoints
            path = ckpt.save(step, state, schedule.meta(self._data_position()), schedule.metrics())
        else:
            path = self.plan.checkpoint.step_location(step)
        ctx.checkpoints.last = path
        ctx.callbacks.dispatch("on_checkpoint", path)
        self._saved_step = step
        self._last_save_t = time.monotonic()
        if self._durable:
            ckpt.wait()  # raises a failed background save's error
        return path

    def flush_metrics(self) -> None:
        """Fetch the pending step metrics now (and apply the non-finite policy)."""
        self.ctx.metrics.flush()

    # -- end ----------------------------------------------------------------------------
    def _raise_preempted(self) -> None:
        ckpt = self.checkpointer
        path = None
        step = self.ctx.progress.step
        if self.plan.checkpoint is not None and self._saved_step == step:
            path = self.plan.checkpoint.step_location(step)
        self.ctx.metrics.close_writers()
        if ckpt is not None:
            ckpt.close()
        self._release()
        raise Preempted(step, path, self._preempted_by)

    def settle(self) -> None:
        """Wait until every save is durable; after a preemption restore the handlers and
        raise `Preempted` (for drivers without an end, like `OnlineTrainer`)."""
        self._wait_for_saves()
        if self._preempted:
            self._signals.restore()
            self._raise_preempted()

    def final_state(self, state: Any) -> Any:
        """The state whose weights the artifact holds; the adapter builds `finish`'s model
        from it.

        Without `plan.restore_best` (or after a preemption) it is `state`. With it, the
        checkpoint of the step whose validation gave the best monitored value
        (`Checkpoint.monitor`, the step `artifact.best_step` names; the run saved it when
        the value improved) is restored into `state` through the checkpoint engine, as a
        resume restores (an engine that loads into live objects, Keras's and the torch
        backends', loads it there), and its state is returned. When that step is the last
        one `state` is returned as it is; when no validation gave a finite value, or the
        checkpoint cannot be restored (missing or torn: warned), the last weights stay,
        with a warning. The step whose weights the artifact holds is recorded as
        `TrainingArtifact.weights_step`.
        """
        step = self.ctx.progress.step
        self._weights_step = step
        if not self.plan.restore_best or self._preempted or self.checkpointer is None:
            return state
        validation = self.ctx.validation
        best = validation.best_step
        if best is None:
            warnings.warn(
                f"restore_best=True, but no validation gave a finite `{validation.monitor}`: "
                f"the artifact holds the last weights (step {step}).",
                stacklevel=2,
            )
            return state
        if best == step:
            return state
        self._wait_for_saves()
        restored = self.checkpointer.restore_step(best, state)
        if restored is None:
            warnings.warn(
                f"restore_best=True, but the checkpoint of the best step {best} "
                f"(`{validation.monitor}`={validation.best_metric}) could not be restored: "
                f"the artifact holds the last weights (step {step}). An earlier run without "
                "restore_best does not save the best step when it validates it; a torn "
                "checkpoint was warned about above.",
                stacklevel=2,
            )
            return state
        self._weights_step = best
        return restored.state

    def finish(
        self, model: Any, *, extra: Mapping[str, Any] | None = None, raw_model: Any = None
    ) -> TrainingArtifact:
        """Wait for durable saves, restore the handlers; raise `Preempted` or return the artifact.

        `model` (and `raw_model`) are built from `final_state(state)`, which chooses the
        weights (the last ones, or the best checkpoint's with `restore_best`).
        """
        ckpt = self.checkpointer
        if not self._began:
            self.begin()
        self.ctx.metrics.flush()
        self._wait_for_saves()
        self._signals.restore()
        if self._preempted:
            self._raise_preempted()
        weights_step = self._weights_step
        if weights_step is None:
            weights_step = self.ctx.progress.step
            if self.plan.restore_best:
                warnings.warn(
                    "restore_best=True, but the adapter built the artifact without asking "
                    "RunLifecycle.final_state for the weights: it holds the last ones "
                    f"(step {weights_step}). An adapter bug.",
                    stacklevel=2,
                )
        artifact = self.ctx.finish(
            model, extra=extra, raw_model=raw_model, weights_step=weights_step
        )
        if ckpt is not None:
            ckpt.close()
        self._release()
        return artifact

    def close(self) -> None:
        """Wait for pending saves and restore the handlers (drivers without an end)."""
        self._signals.restore()
        if self.checkpointer is not None:
            self.checkpointer.close()
        self._release()

    def abort(self) -> None:
        """After a failure: flush/close the writers, let pending saves finish, restore the
        handlers. Never raises, so the original error propagates."""
        try:
            self._signals.restore()
        except Exception:
            pass
        self.ctx.abort()
        ckpt = self.checkpointer
        if ckpt is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    ckpt.close()
                except Exception:
                    pass
        try:
            self._release()
        except Exception:
            pass
