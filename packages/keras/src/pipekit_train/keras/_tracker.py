"""What the adapter adds to Keras's own train step: the core loss and per-step losses.

- `CoreLoss` wraps core's array-API `loss(pred, target)` as a `keras.losses.Loss`, so it
  runs inside Keras's compiled step on the backend's tensors.
- `StepLossTracker` replaces the compiled model's loss tracker (`Mean(name="loss")`).
  Keras's train step (jax and torch alike) calls `self._loss_tracker.update_state(loss,
  sample_weight=batch_size)` with the unscaled loss of every step; the tracker writes it
  into a ring buffer of `capacity` slots and counts the steps, in metric variables that
  stay on the device and travel through Keras's stateless jax state. With
  `steps_per_execution=K` Keras hands callbacks only the last step's logs, but those
  logs carry the buffer and the count, so every step's loss is recovered exactly. The
  logs hold only that one array (no running-mean `loss`), and on jax it is wrapped in
  `DeviceLogs`, which Keras's callback machinery does not convert: no device sync per
  step; the run fetches the losses in groups (`_fetch.fetch`).

This module imports keras; import it only after the Keras backend is chosen.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

import keras
from keras import ops

__all__ = [
    "CoreLoss",
    "DeviceLogs",
    "StepLossTracker",
    "eval_loss",
    "install_tracker",
    "keras_loss",
    "last_loss",
    "packed_losses",
]

LOSSES_KEY = "pipekit_step_losses"
COUNT_MODULUS = 2**24  # the step count travels as float32, exact below 2**24


class CoreLoss(keras.losses.Loss):
    """A core `loss(pred, target)` (a mean over the batch) as a Keras loss.

    Args:
        fn: core's loss callable; called as `fn(y_pred, y_true)` on backend tensors.
    """

    def __init__(self, fn: Any):
        name = getattr(fn, "name", None) or getattr(fn, "__name__", None) or "pipekit_loss"
        super().__init__(name=str(name), reduction="sum_over_batch_size")
        self.fn = fn

    def call(self, y_true: Any, y_pred: Any) -> Any:
        """Keras's argument order in, core's out."""
        return self.fn(y_pred, y_true)

    def get_config(self) -> dict[str, Any]:
        """Name only: the wrapped callable is not serialisable by Keras."""
        return {"name": self.name}


def _native(loss: Any) -> Any:
    native = getattr(loss, "fn", loss)
    return native if isinstance(native, keras.losses.Loss) else None


def keras_loss(loss: Any) -> Any:
    """The Keras loss for a plan's loss: a Keras `Loss` as is, else a `CoreLoss`."""
    return _native(loss) or CoreLoss(loss)


def eval_loss(loss: Any, pred: np.ndarray, target: np.ndarray) -> float:
    """The plan's loss on host arrays (validation)."""
    native = _native(loss)
    if native is not None:
        return float(ops.convert_to_numpy(native(target, pred)))
    return float(np.asarray(loss(pred, target)))


class DeviceLogs:
    """A device array in Keras logs that Keras leaves alone.

    Keras's callback list converts every tensor in the logs to a host float
    (`pythonify_logs`), a device sync per execution. On jax this class is a registered
    pytree node, so it passes out of the jitted train step holding a fresh array that
    Keras neither converts nor donates; the adapter fetches it to the host in groups.
    """

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return f"DeviceLogs(shape={tuple(getattr(self.value, 'shape', ()))})"


_REGISTERED = False


def _register_pytree() -> None:
    global _REGISTERED
    if not _REGISTERED:
        import jax

        jax.tree_util.register_pytree_node(
            DeviceLogs, lambda d: ((d.value,), None), lambda _, children: DeviceLogs(children[0])
        )
        _REGISTERED = True


class StepLossTracker(keras.metrics.Metric):
    """A loss tracker keeping the last per-step losses and a step count on the device.

    `result()` is one float32 array of `capacity + 1` values, the ring buffer followed by
    the step count modulo 2**24 (exact in float32), wrapped in a `DeviceLogs` when
    `deferred` (jax), so reading it costs no device sync.

    Args:
        capacity: the ring buffer size (the most steps between two callbacks).
        deferred: wrap the result in `DeviceLogs` (jax backend only).
    """

    def __init__(self, capacity: int, deferred: bool = False):
        super().__init__(name="loss")
        self.capacity = int(capacity)
        self.deferred = bool(deferred)
        if self.deferred:
            _register_pytree()
        self.buffer = self.add_variable(
            (self.capacity,), initializer="zeros", name="step_losses", dtype="float32"
        )
        self.steps = self.add_variable((), initializer="zeros", name="step_count", dtype="int32")
        # on_nonfinite="skip" (see `_skip`): the latest loss, and whether a batch of the
        # update being accumulated had a non-finite loss (1.0) or not (0.0)
        self.latest = self.add_variable(
            (), initializer="zeros", name="latest_loss", dtype="float32"
        )
        self.update_bad = self.add_variable(
            (), initializer="zeros", name="update_bad", dtype="float32"
        )

    def update_state(self, values: Any, sample_weight: Any = None) -> None:
        """Record one step's (unscaled) loss."""
        value = ops.cast(values, "float32")
        self.latest.assign(ops.reshape(value, ()))
        steps = self.steps.value
        hit = ops.equal(ops.arange(self.capacity, dtype="int32"), ops.mod(steps, self.capacity))
        self.buffer.assign(ops.where(hit, value, self.buffer.value))
        self.steps.assign(ops.mod(steps + 1, COUNT_MODULUS))

    def result(self) -> dict[str, Any]:
        """`{LOSSES_KEY: [buffer..., count]}`."""
        count = ops.reshape(ops.cast(self.steps.value, "float32"), (1,))
        packed = ops.concatenate([self.buffer.value, count])
        return {LOSSES_KEY: DeviceLogs(packed) if self.deferred else packed}

    def reset_state(self) -> None:
        """Zero everything (Keras calls this at the start of each epoch)."""
        for var in self.variables:
            var.assign(ops.zeros(var.shape, var.dtype))


def install_tracker(model: Any, capacity: int, *, deferred: bool = False) -> StepLossTracker:
    """Replace the compiled model's loss tracker with a `StepLossTracker`; return it.

    Set without Keras's attribute tracking, as `compile` sets the original, so the
    tracker is not listed twice in `model.metrics`.
    """
    tracker = StepLossTracker(capacity, deferred=deferred)
    object.__setattr__(model, "_loss_tracker", tracker)
    return tracker


def packed_losses(logs: Mapping[str, Any]) -> Any:
    """The tracker's packed array from Keras logs (a device array or host numpy)."""
    value = logs[LOSSES_KEY]
    return value.value if isinstance(value, DeviceLogs) else value


def last_loss(logs: Mapping[str, Any]) -> np.float32:
    """The loss of the latest step in host `logs` (`train_on_batch`)."""
    packed = np.asarray(packed_losses(logs), dtype=np.float32).reshape(-1)
    capacity = len(packed) - 1
    return packed[(int(packed[-1]) - 1) % capacity]
