"""`run_step_loop`: the whole training loop for backends that expose a train step.

Step-based adapters (the numpy reference adapter, Equinox) implement `StepBackend` and get
batching, fused multi-step execution, validation, checkpoint/resume, preemption, time
budgets, callbacks, writers and the artifact from here: the loop below only feeds
batches to the backend; `RunLifecycle` owns everything around the steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ._adapter import StepBackend
from ._artifact import TrainingArtifact
from ._lifecycle import RunLifecycle, abort_run, check_resume_key, restore_or_start
from ._plan import Plan, is_core_dataset

__all__ = [
    "abort_run",
    "check_resume_key",
    "restore_or_start",
    "run_step_loop",
    "stack_batches",
]


def stack_batches(batches: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Stack K batches into one dict of arrays with a leading axis of size K."""
    return {key: np.stack([b[key] for b in batches]) for key in batches[0]}


def run_step_loop(plan: Plan, backend: StepBackend[Any]) -> TrainingArtifact:
    """Run a whole training loop on a `StepBackend` and return the artifact.

    Raises:
        Preempted: a preemption signal arrived; the step it reached is checkpointed.
    """
    holder: dict[str, Any] = {}
    run = RunLifecycle(
        plan,
        checkpointer=backend.checkpointer() if plan.checkpoint is not None else None,
        fetch=backend.fetch,
        learning_rate=lambda: backend.learning_rate(holder["state"]),
        is_chief=bool(backend.is_chief),
    )
    ctx, ckpt = run.ctx, run.checkpointer
    k_max = max(1, int(backend.steps_per_execution))
    try:
        state, batches = run.start(
            backend.init_state(), shard=backend.data_shard, native=_native(backend, plan)
        )
        holder["state"] = state
        native_val = plan.validation is not None and not is_core_dataset(plan.validation)

        def validate() -> None:
            current = holder["state"]
            ctx.validate(
                lambda batch: backend.eval_batch(current, batch),
                batches=backend.native_eval_batches(plan.validation) if native_val else None,
            )

        def save() -> None:
            assert ckpt is not None
            path = ckpt.save(
                ctx.step, holder["state"], ctx.checkpoint_meta(), ctx.checkpoint_metrics()
            )
            ctx.record_checkpoint(path)

        run.bind(save=save, validate=validate, agree=getattr(backend, "agree", None))
        if ctx.adjusts_lr:

            def rescale(scale: float) -> None:
                holder["state"] = backend.with_lr_scale(holder["state"], scale)

            ctx.bind_lr_scale(rescale)
        run.begin()
        micro = plan.accumulate_grad_batches
        while not ctx._done:
            state = holder["state"]
            k = ctx.steps_until_event(k_max) if k_max > 1 else 1
            if k == 1 and micro == 1:
                state, metrics = backend.train_step(state, backend.put(next(batches)))
            else:
                # k updates of `micro` accumulated batches each, in one call
                group = stack_batches([next(batches) for _ in range(k * micro)])
                state, metrics = backend.train_steps(state, backend.put(group))
            holder["state"] = state
            run.end_of_update(metrics, k, micro=micro)
        return run.finish(
            backend.model_op(holder["state"]), raw_model=backend.raw_model_op(holder["state"])
        )
    except BaseException:
        run.abort()
        raise


def _native(backend: StepBackend[Any], plan: Plan) -> Any:
    return lambda data_state: backend.native_batches(plan.data, data_state)
