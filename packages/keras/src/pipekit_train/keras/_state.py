"""`TrainState`: the training state of a Keras run (what a checkpoint holds), and building it.

The state is a compiled copy of the plan's model, its built optimizer (the moving average
of the weights, the learning-rate scale and the grad-norm buffer are optimizer
variables) and, on the torch backend, torch's global RNG. `build_train_state` builds
one for `model.fit` (`_bridge`) or for `OnlineTrainer` (`_step_backend`); the encoding
of a checkpoint is in `_checkpoint`.

This module imports keras; import it only after the Keras backend is chosen.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import keras
from pipekit_train.core.adapter import Plan, adjusts_learning_rate

from ._ema import has_ema, swapped_in
from ._grad_norm import NORMS_NAME, install_grad_norm
from ._model import KerasModelOp, model_variables, output_model_op
from ._optim import attach_lr_scale, build_optimizer
from ._rollout import RolloutLoss, install_rollout
from ._skip import install_skip
from ._tracker import install_tracker, keras_loss

__all__ = ["TrainState", "build_train_state", "learning_rate", "output_model_ops", "predict"]


def _torch_rng() -> dict[str, np.ndarray]:
    import torch

    out = {"rng/torch": torch.get_rng_state().numpy().copy()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            out[f"rng/cuda/{i:03d}"] = state.numpy().copy()
    return out


def _set_torch_rng(arrays: Mapping[str, np.ndarray]) -> None:
    import torch

    torch.set_rng_state(torch.from_numpy(np.array(arrays["rng/torch"], dtype=np.uint8)))
    cuda = sorted(k for k in arrays if k.startswith("rng/cuda/"))
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(
            [torch.from_numpy(np.array(arrays[k], dtype=np.uint8)) for k in cuda]
        )


@dataclass
class TrainState:
    """The live training state: a compiled model and its built optimizer.

    Restoring assigns into these variables in place (the optimizer is built first:
    loading into an unbuilt Keras optimizer would silently skip its state).

    On the torch backend Keras's unseeded ops (dropout) draw from torch's global RNG,
    which is part of the state too: `start_rng()` seeds it from `seed` on a fresh run or
    applies the restored state. With `defer_rng` a restore only records the state, and
    the caller invokes `start_rng()` right before the first step (after `model.fit`'s
    data loader has drawn its own seed from the same RNG).
    """

    model: Any
    optimizer: Any
    seed: int = 0
    sync: Any = None  # () -> None: bring jax fit state back into the variables
    defer_rng: bool = False
    grad_norms: Any = None  # the `GradNormBuffer` of `log_grad_norm` runs
    rollout: RolloutLoss | None = None  # the rollout loss of `rollout=` runs
    _pending_rng: dict[str, np.ndarray] | None = field(default=None, repr=False)

    @property
    def torch_rng(self) -> bool:
        """Whether the global torch RNG belongs to the state (torch Keras backend)."""
        return keras.backend.backend() == "torch"

    def start_rng(self) -> None:
        """Seed torch's global RNG from `seed`, or apply the restored state (torch only)."""
        if not self.torch_rng:
            return
        pending, self._pending_rng = self._pending_rng, None
        if pending is not None:
            _set_torch_rng(pending)
        else:
            import torch

            torch.manual_seed(int(self.seed))

    def rng_state(self) -> dict[str, np.ndarray]:
        """Host copies of the RNG state that belongs to the run (torch only; else empty)."""
        return _torch_rng() if self.torch_rng else {}

    def restore_rng(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Take a checkpoint's RNG state (the `rng/...` arrays of `rng_state()`), applied
        now, or by `start_rng()` with `defer_rng` (torch only)."""
        if not self.torch_rng:
            return
        self._pending_rng = dict(arrays)
        if not self.defer_rng:
            self.start_rng()

    def variables(self) -> tuple[list[Any], list[Any]]:
        """`(model variables, optimizer variables)` in a stable order."""
        if self.sync is not None:
            self.sync()
        # the grad_norm ring buffer (`_grad_norm.py`) is a metric, not training state
        optimizer_vars = [v for v in self.optimizer.variables if v.name != NORMS_NAME]
        return model_variables(self.model), optimizer_vars


def build_train_state(
    plan: Plan,
    *,
    precision: str | None,
    steps_per_execution: int,
    jit_compile: Any,
    deferred: bool = False,
) -> TrainState:
    """A fresh compiled copy of the plan's model, its built optimizer and the loss tracker.

    `deferred` (a `model.fit` run): the per-step losses stay on the device in the logs
    (jax), the ring buffer also spans a metrics group, and a restored torch RNG state is
    applied only when `start_rng()` is called before the first step.
    """
    assert isinstance(plan.model, KerasModelOp)  # the adapter's validate_online() checked it
    model = plan.model.build_model(precision=precision)
    micro = plan.accumulate_grad_batches
    scaled = adjusts_learning_rate(plan)
    rollout = getattr(plan, "rollout", None)
    model.compile(
        optimizer=build_optimizer(plan.optimizer_config, accumulate=micro, lr_scale=scaled),
        # a rollout run computes its loss itself (`_rollout`): no compiled loss
        loss=keras_loss(plan.loss) if rollout is None else None,
        # fused executions run whole updates; unfused ones run one batch per call
        steps_per_execution=steps_per_execution * micro if steps_per_execution > 1 else 1,
        jit_compile=jit_compile,
    )
    optimizer = model.optimizer
    optimizer.build(model.trainable_variables)  # before any restore (see TrainState)
    if scaled:
        attach_lr_scale(optimizer)  # an optimizer variable: checkpointed with the others
    # the ring buffer also covers a whole metrics group, so one snapshot serves a flush
    # (Keras runs batches: with accumulation, `micro` per optimizer step)
    capacity = (steps_per_execution + (plan.log_every_n_steps if deferred else 0)) * micro
    tracker = install_tracker(
        model, capacity, deferred=deferred and keras.backend.backend() == "jax"
    )
    if plan.on_nonfinite == "skip":
        install_skip(model, tracker, micro)
    norms = None
    if plan.log_grad_norm:
        norms = install_grad_norm(optimizer, max(1, capacity // micro))
    training = install_rollout(model, plan) if rollout is not None else None
    sync = getattr(model, "jax_state_sync", None)
    return TrainState(
        model=model,
        optimizer=optimizer,
        seed=plan.seed,
        sync=sync,
        defer_rng=deferred,
        grad_norms=norms,
        rollout=training,
    )


def output_model_ops(op: Any, state: TrainState) -> tuple[Any, Any]:
    """`(model, raw model or None)` for the artifact: with `optimizer_config["ema"]` the
    model holds the moving average and the raw model the trained weights."""
    raw = output_model_op(op, state.model)
    if not has_ema(state.optimizer):
        return raw, None
    with swapped_in(state.optimizer):
        return output_model_op(op, state.model), raw


def predict(state: TrainState, x: np.ndarray) -> np.ndarray:
    """Inference with the training model; float32 numpy out."""
    pred = np.asarray(state.model.predict_on_batch(x))
    if pred.dtype != np.float64:
        pred = pred.astype(np.float32)
    return pred


def learning_rate(state: TrainState) -> float | None:
    """The optimizer's current learning rate (schedules evaluated at its iteration)."""
    if state.sync is not None:
        state.sync()
    try:
        return float(keras.ops.convert_to_numpy(state.optimizer.learning_rate))
    except Exception:  # an exotic optimizer without a scalar rate
        return None
