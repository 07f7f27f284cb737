"""One training run through `model.fit`, driven by core's `RunLifecycle`.

Keras runs its own compiled loop; a Keras callback (`FitCallback`) reports every update
to the lifecycle (`end_of_update`), which does what is due:

- after each execution (1 or K steps) it hands the steps' losses — still on the
  device, a `StepSlice` of the `StepLossTracker` ring buffer — to the lifecycle, which
  records them (core dispatches `on_step_end` per step and fetches the losses for
  the writers in groups, with `_fetch.fetch`);
- validation and checkpoints run when they are due (the lifecycle validates with the
  session's `eval_batch` inside its `eval_scope`, and saves the `TrainState` with the
  data position after the last batch trained on); with `steps_per_execution=K` the next
  execution is shortened (`run.steps_until_event(K)`) so they land on exactly the same
  steps as with K=1;
- `model.stop_training = True` when `end_of_update` says the run is done (max steps,
  early stopping, a preemption signal, the time budget).

Overriding `on_train_batch_end` also makes Keras dispatch callbacks synchronously,
which is faster than its thread pool on small machines; the logs hold nothing Keras
converts to host floats, so that costs no device sync.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

import keras
from pipekit_train.core.adapter import (
    GRAD_NORM,
    Plan,
    RunLifecycle,
    TrainingArtifact,
    evaluates_as_rollout,
)

from ._checkpoint import checkpointer
from ._data import fit_batches, native_batches, native_eval_batches
from ._ema import swapped_in
from ._fetch import StepSlice, fetch
from ._optim import set_lr_scale
from ._state import build_train_state, learning_rate, output_model_ops, predict
from ._tracker import COUNT_MODULUS, eval_loss, packed_losses

__all__ = ["FitCallback", "FitSession"]


class FitCallback(keras.callbacks.Callback):
    """The Keras callback that drives core's `RunLifecycle` from inside `model.fit`."""

    def __init__(self, session: FitSession, run: RunLifecycle):
        super().__init__()
        self.session = session
        self.run = run
        self.count = 0  # the tracker's batch count (mod COUNT_MODULUS) at the last recorded step
        self.expected = 1  # batches Keras runs in the next execution
        self.pending = 0  # batches run since the last recorded step (accumulation)
        self.micro = session.plan.accumulate_grad_batches
        self._rng_started = False
        self.norm_count = 0  # the grad-norm buffer's update count at the last recorded step
        self._norm_index: int | None = None

    def _norm_buffer(self, norms: Any) -> Any:
        """The grad-norm buffer's value now, without a device sync.

        On jax the fit loop holds the optimizer variables as arrays between executions
        (`model._jax_state`, immutable snapshots); on torch the variable is updated in
        place, so it is copied."""
        model = self.session.state.model
        jax_state = getattr(model, "_jax_state", None)
        if jax_state is not None and jax_state.get("optimizer_variables") is not None:
            if self._norm_index is None:
                opt = self.session.state.optimizer
                self._norm_index = next(
                    i for i, v in enumerate(opt.variables) if v is norms.variable
                )
            return jax_state["optimizer_variables"][self._norm_index]
        value = norms.variable.value
        return value.clone() if hasattr(value, "clone") else value

    def _schedule_next(self) -> None:
        s = self.session
        if s.k_max > 1:
            k = self.run.steps_until_event(s.k_max) * self.micro  # batches, not updates
            if k != self.expected or s.state.model.steps_per_execution != k:
                s.state.model.steps_per_execution = k  # read per call by Keras's jax loop
            self.expected = k

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        """Size the first execution, start a rollout schedule's clock at the run's
        update, and zero the grad-norm buffer."""
        if self.session.state.rollout is not None:
            self.session.state.rollout.start(self.run.step)
        norms = self.session.state.grad_norms
        if norms is not None:
            norms.reset()
            self.norm_count = 0
        self._schedule_next()
        self._rng_started = False

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Before the first step (after Keras's torch data loader drew its seed): RNG."""
        if not self._rng_started:
            self._rng_started = True
            self.session.state.start_rng()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Record the steps just run, then validate / checkpoint / stop as due."""
        s = self.session
        self.pending += self.expected
        if self.pending % self.micro:  # mid-accumulation: no optimizer update yet
            return
        n = self.pending
        self.pending = 0
        # the per-batch losses stay on the device; the run fetches them in groups and
        # StepSlice checks then that Keras ran exactly the n batches scheduled
        losses = StepSlice(packed_losses(logs or {}), self.count, n)
        self.count = (self.count + n) % COUNT_MODULUS
        metrics: dict[str, Any] = {"loss": losses}
        if s.state.grad_norms is not None:  # one norm per update, its own ring buffer
            updates = n // self.micro
            packed = self._norm_buffer(s.state.grad_norms)
            metrics[GRAD_NORM] = StepSlice(packed, self.norm_count, updates, kind=GRAD_NORM)
            self.norm_count = (self.norm_count + updates) % COUNT_MODULUS
        # n // micro updates of micro batches each: the run's data position moves n batches
        done = self.run.end_of_update(metrics, n // self.micro, micro=self.micro)
        if done:
            self.model.stop_training = True
        else:
            self._schedule_next()


class FitSession:
    """Everything one `Keras.run(plan)` call holds.

    Args:
        plan: the frozen plan.
        precision: a Keras dtype policy name, or None for the default.
        steps_per_execution: the most steps Keras runs between two callbacks.
        jit_compile: forwarded to `model.compile`.
        distribution: a `keras.distribution.Distribution` to train under, or None.
    """

    def __init__(
        self,
        plan: Plan,
        *,
        precision: str | None,
        steps_per_execution: int,
        jit_compile: Any,
        distribution: Any = None,
    ):
        self.plan = plan
        self.k_max = int(steps_per_execution)
        self.distribution = distribution
        with self._scope():
            self.state = build_train_state(
                plan,
                precision=precision,
                steps_per_execution=self.k_max,
                jit_compile=jit_compile,
                deferred=True,
            )

    def _scope(self) -> Any:
        return (
            self.distribution.scope() if self.distribution is not None else contextlib.nullcontext()
        )

    # -- what the lifecycle calls ----------------------------------------------------------
    def set_lr_scale(self, scale: float) -> None:
        """Core's learning-rate scale into the optimizer variable (read by the next step)."""
        if self.state.sync is not None:
            self.state.sync()  # then Keras's jax loop re-reads the variables
        set_lr_scale(self.state.optimizer, scale)

    def eval_batch(self, batch: dict[str, np.ndarray]) -> tuple[np.ndarray, float]:
        """`(predictions, mean loss)` of one validation batch."""
        rollout = self.state.rollout
        if rollout is not None and evaluates_as_rollout(batch, rollout.rollout):
            # windows: the longest rollout, without noise; pairs (`state.predict`, e.g.
            # RolloutMonitor's one-step calls): one model application, below
            return rollout.eval_rollout(lambda x: predict(self.state, x), batch)
        pred = predict(self.state, batch["x"])
        return pred, eval_loss(self.plan.loss, pred, np.asarray(batch["y"]))

    @contextlib.contextmanager
    def eval_scope(self) -> Iterator[None]:
        """Around a validation pass: the fit state synced into the variables, and the
        moving average of the weights swapped in (if the plan keeps one)."""
        if self.state.sync is not None:
            self.state.sync()
        with swapped_in(self.state.optimizer):
            yield

    def _native(self, data_state: Any) -> Any:
        # a PyDataset (or tf.data): iterated here, one process
        return native_batches(self.plan.data, data_state)

    # -- the run ---------------------------------------------------------------------------
    def run(self) -> TrainingArtifact:
        """Restore or start, fit until done, and assemble the artifact."""
        plan, state = self.plan, self.state
        ckpt = checkpointer(plan.checkpoint) if plan.checkpoint is not None else None
        with RunLifecycle(
            plan,
            checkpointer=ckpt,
            fetch=fetch,
            learning_rate=lambda: learning_rate(state),
        ) as run:
            # Keras reads a few batches ahead of the step it runs (it peeks at the first
            # two; on accelerators it transfers one ahead): the feed tracks every position
            _, feed = run.start(state, native=self._native, track=True)
            run.bind(
                state=lambda: state,
                eval_batch=self.eval_batch,
                eval_batches=native_eval_batches,
                eval_scope=self.eval_scope,
                lr_scale=self.set_lr_scale,
            )
            run.begin()
            if not run.done:
                with self._scope():
                    state.model.fit(
                        fit_batches(feed, rollout=state.rollout is not None),
                        epochs=1,
                        verbose=0,
                        shuffle=False,
                        callbacks=[FitCallback(self, run)],
                    )
            run.flush_metrics()  # fetches (and checks) the last steps' losses
            # with restore_best: the best checkpoint, loaded into the live variables
            op, raw = output_model_ops(plan.model, run.final_state(state))
            return run.finish(op, raw_model=raw)
