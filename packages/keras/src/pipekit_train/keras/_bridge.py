"""One training run through `model.fit`, driven by core's `RunLifecycle`.

Keras runs its own compiled loop; a Keras callback (`FitCallback`) reports every update
to the lifecycle (`end_of_update`), which does what is due:

- after each execution (1 or K steps) it hands the steps' losses — still on the
  device, a `StepSlice` of the `StepLossTracker` ring buffer — to the lifecycle, which
  records them (core dispatches `on_step_end` per step and fetches the losses for
  the writers in groups);
- validation and checkpoints run when `ctx` says they are due; with
  `steps_per_execution=K` the next execution is shortened
  (`ctx.steps_until_event(K)`) so they land on exactly the same steps as with K=1;
- `model.stop_training = True` when `end_of_update` says the run is done (max steps,
  early stopping, a preemption signal, the time budget).

Overriding `on_train_batch_end` also makes Keras dispatch callbacks synchronously,
which is faster than its thread pool on small machines; the logs hold nothing Keras
converts to host floats, so that costs no device sync.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import numpy as np

import keras
from pipekit_train.core import TrainingArtifact
from pipekit_train.core.adapter import (
    GRAD_NORM,
    Plan,
    RunLifecycle,
    adjusts_learning_rate,
    is_core_dataset,
)

from . import _weights
from ._checkpoint import TrainHandle, checkpointer
from ._data import FitFeed, native_batches, native_eval_batches
from ._ema import has_ema, swapped_in
from ._model import KerasModelOp, model_weights
from ._optim import attach_lr_scale, build_optimizer, set_lr_scale
from ._tracker import (
    COUNT_MODULUS,
    StepSlice,
    eval_loss,
    fetch_values,
    install_tracker,
    keras_loss,
    packed_losses,
)

__all__ = [
    "FitSession",
    "FitCallback",
    "build_train_handle",
    "output_model_op",
    "output_model_ops",
]


def build_train_handle(
    plan: Plan,
    *,
    precision: str | None,
    steps_per_execution: int,
    jit_compile: Any,
    deferred: bool = False,
) -> TrainHandle:
    """A fresh compiled copy of the plan's model, its built optimizer and the loss tracker.

    `deferred` (a `model.fit` run): the per-step losses stay on the device in the logs
    (jax), the ring buffer also spans a metrics group, and a restored torch RNG state is
    applied only when `start_rng()` is called before the first step.
    """
    assert isinstance(plan.model, KerasModelOp)  # the adapter's validate_online() checked it
    model = plan.model.build_model(precision=precision)
    micro = plan.accumulate_grad_batches
    scaled = adjusts_learning_rate(plan)
    model.compile(
        optimizer=build_optimizer(plan.optimizer_config, accumulate=micro, lr_scale=scaled),
        loss=keras_loss(plan.loss),
        # fused executions run whole updates; unfused ones run one batch per call
        steps_per_execution=steps_per_execution * micro if steps_per_execution > 1 else 1,
        jit_compile=jit_compile,
    )
    optimizer = model.optimizer
    optimizer.build(model.trainable_variables)  # before any restore (see _state)
    if scaled:
        attach_lr_scale(optimizer)  # an optimizer variable: checkpointed with the others
    # the ring buffer also covers a whole metrics group, so one snapshot serves a flush
    # (Keras runs batches: with accumulation, `micro` per optimizer step)
    capacity = (steps_per_execution + (plan.log_every_n_steps if deferred else 0)) * micro
    tracker = install_tracker(
        model, capacity, deferred=deferred and keras.backend.backend() == "jax"
    )
    if plan.on_nonfinite == "skip":
        from ._skip import install_skip

        install_skip(model, tracker, micro)
    norms = None
    if plan.log_grad_norm:
        from ._grad_norm import install_grad_norm

        norms = install_grad_norm(optimizer, max(1, capacity // micro))
    sync = getattr(model, "jax_state_sync", None)
    return TrainHandle(
        model=model,
        optimizer=optimizer,
        seed=plan.seed,
        sync=sync,
        defer_rng=deferred,
        grad_norms=norms,
    )


def output_model_op(op: Any, model: Any) -> Any:
    """A new operator (default dtype policy, not compiled) holding `model`'s weights."""
    out = type(op).from_config(op.get_config())
    arrays = _weights.arrays_of("w", model_weights(model))
    _weights.assign_arrays(
        "w", model_weights(out.model), arrays, what="The trained model", cast=True
    )
    return out


def output_model_ops(op: Any, handle: TrainHandle) -> tuple[Any, Any]:
    """`(model, raw model or None)` for the artifact: with `optimizer_config["ema"]` the
    model holds the moving average and the raw model the trained weights."""
    raw = output_model_op(op, handle.model)
    if not has_ema(handle.optimizer):
        return raw, None
    with swapped_in(handle.optimizer):
        return output_model_op(op, handle.model), raw


def predict(handle: TrainHandle, x: np.ndarray) -> np.ndarray:
    """Inference with the training model; float32 numpy out."""
    pred = np.asarray(handle.model.predict_on_batch(x))
    if pred.dtype != np.float64:
        pred = pred.astype(np.float32)
    return pred


def learning_rate(handle: TrainHandle) -> float | None:
    """The optimizer's current learning rate (schedules evaluated at its iteration)."""
    if handle.sync is not None:
        handle.sync()
    try:
        return float(keras.ops.convert_to_numpy(handle.optimizer.learning_rate))
    except Exception:  # an exotic optimizer without a scalar rate
        return None


class FitCallback(keras.callbacks.Callback):
    """The Keras callback that drives core's `RunLifecycle` from inside `model.fit`."""

    def __init__(self, session: FitSession):
        super().__init__()
        self.session = session
        self.count = 0  # the tracker's batch count (mod COUNT_MODULUS) at the last recorded step
        self.consumed = 0  # batches trained on by this fit call
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
        model = self.session.handle.model
        state = getattr(model, "_jax_state", None)
        if state is not None and state.get("optimizer_variables") is not None:
            if self._norm_index is None:
                opt = self.session.handle.optimizer
                self._norm_index = next(
                    i for i, v in enumerate(opt.variables) if v is norms.variable
                )
            return state["optimizer_variables"][self._norm_index]
        value = norms.variable.value
        return value.clone() if hasattr(value, "clone") else value

    def _schedule_next(self) -> None:
        s = self.session
        if s.k_max > 1:
            k = s.ctx.steps_until_event(s.k_max) * self.micro  # batches, not updates
            if k != self.expected or s.handle.model.steps_per_execution != k:
                s.handle.model.steps_per_execution = k  # read per call by Keras's jax loop
            self.expected = k

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        """Size the first execution (and zero the grad-norm buffer)."""
        norms = self.session.handle.grad_norms
        if norms is not None:
            norms.reset()
            self.norm_count = 0
        self._schedule_next()
        self._rng_started = False

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Before the first step (after Keras's torch data loader drew its seed): RNG."""
        if not self._rng_started:
            self._rng_started = True
            self.session.handle.start_rng()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Record the steps just run, then validate / checkpoint / stop as due."""
        s = self.session
        self.consumed += self.expected
        self.pending += self.expected
        if self.pending % self.micro:  # mid-accumulation: no optimizer update yet
            return
        n = self.pending
        self.pending = 0
        # the per-batch losses stay on the device; RunContext fetches them in groups and
        # StepSlice checks then that Keras ran exactly the n batches scheduled
        losses = StepSlice(packed_losses(logs or {}), self.count, n)
        self.count = (self.count + n) % COUNT_MODULUS
        s.consumed = self.consumed
        metrics: dict[str, Any] = {"loss": losses}
        if s.handle.grad_norms is not None:  # one norm per update, its own ring buffer
            updates = n // self.micro
            packed = self._norm_buffer(s.handle.grad_norms)
            metrics[GRAD_NORM] = StepSlice(packed, self.norm_count, updates, kind=GRAD_NORM)
            self.norm_count = (self.norm_count + updates) % COUNT_MODULUS
        done = s.lifecycle.end_of_update(metrics, n // self.micro, micro=self.micro)
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
            self.handle = build_train_handle(
                plan,
                precision=precision,
                steps_per_execution=self.k_max,
                jit_compile=jit_compile,
                deferred=True,
            )
        self.ckpt = checkpointer(plan.checkpoint) if plan.checkpoint is not None else None
        self.lifecycle = RunLifecycle(
            plan,
            checkpointer=self.ckpt,
            fetch=fetch_values,
            learning_rate=lambda: learning_rate(self.handle),
        )
        self.ctx = self.lifecycle.ctx
        if self.ctx.adjusts_lr:
            self.ctx.bind_lr_scale(self._set_lr_scale)
        self.feed: FitFeed | None = None
        self.consumed = 0  # batches trained on by this fit call (the data position)
        self.lifecycle.bind(
            save=self._save_now if self.ckpt is not None else None, validate=self.validate
        )

    def _set_lr_scale(self, scale: float) -> None:
        """Core's learning-rate scale into the optimizer variable (read by the next step)."""
        if self.handle.sync is not None:
            self.handle.sync()  # then Keras's jax loop re-reads the variables
        set_lr_scale(self.handle.optimizer, scale)

    def _scope(self) -> Any:
        return self.distribution.scope() if self.distribution is not None else nullcontext()

    # -- what the bridge calls -----------------------------------------------------------
    def eval_batch(self, batch: dict[str, np.ndarray]) -> tuple[np.ndarray, float]:
        """`(predictions, mean loss)` of one validation batch."""
        pred = predict(self.handle, batch["x"])
        return pred, eval_loss(self.plan.loss, pred, np.asarray(batch["y"]))

    def validate(self) -> None:
        """Run core's validation with the current weights."""
        if self.handle.sync is not None:
            self.handle.sync()
        val = self.plan.validation
        native = native_eval_batches(val) if not is_core_dataset(val) else None
        with swapped_in(self.handle.optimizer):  # the moving average, if the plan keeps one
            self.ctx.validate(self.eval_batch, batches=native)

    def _save_now(self) -> None:
        self.save(self.consumed)

    def save(self, consumed: int) -> None:
        """Checkpoint now: model, optimizer, RNG, data position, run state."""
        assert self.ckpt is not None and self.feed is not None
        ctx = self.ctx
        meta = ctx.checkpoint_meta(self.feed.state_after(consumed))
        path = self.ckpt.save(ctx.step, self.handle, meta, ctx.checkpoint_metrics())
        ctx.record_checkpoint(path)

    # -- the run ---------------------------------------------------------------------------
    def run(self) -> TrainingArtifact:
        """Restore or start, fit until done, and assemble the artifact."""
        run, model = self.lifecycle, self.handle.model
        try:
            _, batches = run.start(self.handle, native=self._native)
            self.feed = FitFeed(batches, self.k_max * self.plan.accumulate_grad_batches)
            run.begin()
            if not run.done:
                with self._scope():
                    model.fit(
                        self.feed.generator(),
                        epochs=1,
                        verbose=0,
                        shuffle=False,
                        callbacks=[FitCallback(self)],
                    )
            self.ctx.flush_metrics()  # fetches (and checks) the last steps' losses
            op, raw = output_model_ops(self.plan.model, self.handle)
            return run.finish(op, raw_model=raw)
        except BaseException:
            run.abort()
            raise

    def _native(self, data_state: Any) -> Any:
        # a PyDataset (or tf.data): iterated here, one process
        return native_batches(self.plan.data, data_state)
