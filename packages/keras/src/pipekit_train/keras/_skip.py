"""`TrainingLoop(on_nonfinite="skip")` on Keras: a train step that drops non-finite updates.

`install_skip` wraps the compiled model's own `train_step` (Keras's, on jax or torch).
After each step it reads the step's loss (the `StepLossTracker`'s `latest` variable) and
keeps the values from before the step where the loss is not finite:

- the trainable weights and every optimizer variable (moments, `iterations`, so the
  learning-rate schedule and Adam's bias correction do not advance, and the loss scale
  of a `LossScaleOptimizer`);
- the floating-point non-trainable variables (BatchNorm statistics); integer ones (RNG
  seed-generator states) advance.

With gradient accumulation (Keras's `gradient_accumulation_steps = m`) the weights only
change on the last batch of an update; the tracker's `update_bad` flag remembers a
non-finite batch earlier in the update, and on the last batch the whole update is dropped:
weights and optimizer state as at the update's start (`iterations` back by `m - 1`, the
accumulators set to zero).

On jax the selection is part of the stateless, jitted step (`where` on every value, no
host sync); on torch the step is eager, so the values are copied before the step and
assigned back after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
from keras import ops

from ._tracker import StepLossTracker

__all__ = ["install_skip"]


def _index(variables: Sequence[Any], target: Any) -> int:
    for i, v in enumerate(variables):
        if v is target:
            return i
    name = getattr(target, "path", type(target).__name__)
    raise RuntimeError(f"variable {name!r} is not part of the training state")


class _Selector:
    """Chooses, per variable, between the values before and after one train step."""

    def __init__(self, model: Any, tracker: StepLossTracker, accumulate: int):
        optimizer = model.optimizer
        inner = getattr(optimizer, "inner_optimizer", optimizer)
        self.m = int(accumulate)
        self.float_nt = ["float" in str(v.dtype) for v in model.non_trainable_variables]
        opt_vars = list(optimizer.variables)
        self.i_iter = _index(opt_vars, inner._iterations)  # batches (not floor-divided)
        accumulators = {id(v) for v in getattr(inner, "_accumulated_gradients", None) or ()}
        self.accumulator = [id(v) in accumulators for v in opt_vars]
        metrics = list(model.metrics_variables)
        self.i_latest = _index(metrics, tracker.latest)
        self.i_bad = _index(metrics, tracker.update_bad)

    def choose(
        self, old: Sequence[Sequence[Any]], new: Sequence[Sequence[Any]]
    ) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
        """`(trainable, non_trainable, optimizer, metrics)` values to keep after the step."""
        (old_t, old_nt, old_o, old_m), (new_t, new_nt, new_o, new_m) = old, new
        ok = ops.isfinite(new_m[self.i_latest])
        nt = [
            ops.where(ok, n, o) if is_float else n
            for n, o, is_float in zip(new_nt, old_nt, self.float_nt, strict=True)
        ]
        metrics = list(new_m)
        if self.m == 1:
            keep_old = ops.logical_not(ok)
            iterations = old_o[self.i_iter]
        else:
            bad_before = ops.greater(old_m[self.i_bad], 0.0)
            update_ok = ops.logical_and(ok, ops.logical_not(bad_before))
            last = ops.equal(ops.mod(old_o[self.i_iter] + 1, self.m), 0)
            keep_old = ops.logical_and(last, ops.logical_not(update_ok))
            iterations = old_o[self.i_iter] - (self.m - 1)  # the update's first batch
            still_bad = ops.logical_and(ops.logical_not(last), ops.logical_not(update_ok))
            metrics[self.i_bad] = ops.where(still_bad, 1.0, 0.0)
        t = [ops.where(keep_old, o, n) for n, o in zip(new_t, old_t, strict=True)]
        opt = []
        for j, (n, o) in enumerate(zip(new_o, old_o, strict=True)):
            if j == self.i_iter:
                opt.append(ops.where(keep_old, ops.cast(iterations, n.dtype), n))
            elif self.accumulator[j]:  # zero after a dropped update: no NaN carried over
                opt.append(ops.where(keep_old, ops.zeros_like(n), n))
            else:
                opt.append(ops.where(keep_old, o, n))
        return t, nt, opt, metrics


def install_skip(model: Any, tracker: StepLossTracker, accumulate: int) -> None:
    """Wrap `model.train_step` so steps with a non-finite loss are dropped (see the module)."""
    selector = _Selector(model, tracker, accumulate)
    step = model.train_step  # Keras's own, bound

    if keras.backend.backend() == "jax":

        def train_step(state: Any, data: Any) -> Any:
            logs, new_state = step(state, data)
            return logs, selector.choose(state, new_state)

    else:
        import torch

        groups = (
            lambda: model.trainable_variables,
            lambda: model.non_trainable_variables,
            lambda: model.optimizer.variables,
            lambda: model.metrics_variables,
        )

        def train_step(data: Any) -> Any:  # type: ignore[misc]  # redefined per backend branch
            with torch.no_grad():
                old = [[v.value.detach().clone() for v in get()] for get in groups]
            logs = step(data)
            with torch.no_grad():
                variables = [list(get()) for get in groups]
                new = [[v.value for v in vs] for vs in variables]
                chosen = selector.choose(old, new)
                for vs, values, before in zip(variables, chosen, new, strict=True):
                    for v, value, current in zip(vs, values, before, strict=True):
                        if value is not current:
                            v.assign(value)
            return logs

    object.__setattr__(model, "train_step", train_step)
