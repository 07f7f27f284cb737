"""`run_step_loop`: the whole training loop for backends that expose a train step.

Step-based adapters (the numpy reference adapter, Equinox) implement `StepBackend` and get
batching, fused multi-step execution, validation, checkpoint/resume, callbacks, writers
and the artifact from here. `restore_or_start` is the one resume path: the step driver,
the Lightning and Keras bridges and `OnlineTrainer` all use it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ._adapter import StepBackend
from ._artifact import TrainingArtifact
from ._checkpointing import Checkpointer, Restored
from ._errors import CheckpointError
from ._plan import Plan, is_core_dataset
from ._runtime import RunContext

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
    ctx.restore(restored.meta)
    return restored.state, restored.meta.get("data_iter")


def abort_run(ctx: RunContext, ckpt: Checkpointer | None) -> None:
    """After a failure: flush and close the writers, let pending checkpoint writes finish.

    Never raises, so the original error propagates; the last complete checkpoint stays.
    """
    ctx.abort()
    if ckpt is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                ckpt.close()
            except Exception:
                pass


def run_step_loop(plan: Plan, backend: StepBackend[Any]) -> TrainingArtifact:
    """Run a whole training loop on a `StepBackend` and return the artifact."""
    holder: dict[str, Any] = {}
    ctx = RunContext(
        plan,
        fetch=backend.fetch,
        learning_rate=lambda: backend.learning_rate(holder["state"]),
        is_chief=bool(backend.is_chief),
    )
    ckpt = backend.checkpointer() if plan.checkpoint is not None else None
    k_max = max(1, int(backend.steps_per_execution))
    try:
        state = backend.init_state()
        state, data_state = restore_or_start(plan, ckpt, state, ctx)
        holder["state"] = state
        if is_core_dataset(plan.data):
            batches = ctx.train_batches(data_state, shard=backend.data_shard)
        else:  # a native loader the adapter accepted
            batches = ctx.use_train_iterator(backend.native_batches(plan.data, data_state))
        native_val = plan.validation is not None and not is_core_dataset(plan.validation)
        ctx.begin()

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

        micro = plan.accumulate_grad_batches
        while not ctx.done:
            k = ctx.steps_until_event(k_max) if k_max > 1 else 1
            if k == 1 and micro == 1:
                state, metrics = backend.train_step(state, backend.put(next(batches)))
            else:
                # k updates of `micro` accumulated batches each, in one call
                group = stack_batches([next(batches) for _ in range(k * micro)])
                state, metrics = backend.train_steps(state, backend.put(group))
            holder["state"] = state
            ctx.after_steps(
                metrics, k, micro=micro, validate=validate, checkpoint=save if ckpt else None
            )
        if ckpt is not None:
            ckpt.wait()
        artifact = ctx.finish(backend.model_op(state))
    except BaseException:
        abort_run(ctx, ckpt)
        raise
    if ckpt is not None:
        ckpt.close()
    return artifact
