"""`run_step_loop`: the whole training loop for backends that expose a train step.

The numpy reference adapter and the Equinox adapter implement `StepBackend` and get
batching, fused multi-step execution, validation, checkpoint/resume, callbacks, writers
and the artifact from here.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from ._artifact import TrainingArtifact
from ._checkpointing import Checkpointer, Restored
from ._errors import CheckpointError
from ._plan import Plan
from ._runtime import RunContext

__all__ = [
    "StepBackend",
    "abort_run",
    "check_resume_key",
    "restore_or_start",
    "run_step_loop",
    "stack_batches",
]


class StepBackend(Protocol):
    """A backend that trains one (or K fused) step(s) at a time.

    Optional members, looked up with `getattr`: `steps_per_execution` (int, default 1)
    with `train_steps(state, stacked_batch) -> (state, stacked_metrics)`; `fetch(values)`
    (device → host in one call); `learning_rate(state) -> float | None`;
    `data_shard -> (index, count)` for multi-process data; `is_chief` (bool).
    """

    def init_state(self) -> Any:
        """Build the initial training state (model, optimizer state, RNG, step)."""
        ...

    def put(self, batch: Mapping[str, np.ndarray]) -> Any:
        """Move a numpy batch (or a stacked group of batches) onto the device."""
        ...

    def train_step(self, state: Any, batch: Any) -> tuple[Any, Mapping[str, Any]]:
        """One optimizer step; metrics may stay on the device."""
        ...

    def eval_batch(self, state: Any, batch: Mapping[str, np.ndarray]) -> tuple[Any, Any]:
        """`(predictions, mean loss)` on one validation batch."""
        ...

    def model_op(self, state: Any) -> Any:
        """The trained model operator for `state`."""
        ...

    def checkpointer(self) -> Checkpointer:
        """The checkpoint engine for `plan.checkpoint`."""
        ...


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
    """Apply the resume policy; return `(state, data_iter_state)`."""
    if ckpt is None or plan.checkpoint is None or plan.checkpoint.resume == "never":
        return template, None
    restored: Restored | None = ckpt.restore_latest(template)
    if restored is None:
        if plan.checkpoint.resume == "must":
            raise CheckpointError(
                f"`Checkpoint.resume='must'` but no complete checkpoint exists in "
                f"{plan.checkpoint.path}. Use resume='auto' to start fresh."
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


def run_step_loop(plan: Plan, backend: StepBackend) -> TrainingArtifact:
    """Run a whole training loop on a `StepBackend` and return the artifact."""
    state_fn = getattr(backend, "learning_rate", None)
    holder: dict[str, Any] = {}
    ctx = RunContext(
        plan,
        fetch=getattr(backend, "fetch", None),
        learning_rate=(lambda: state_fn(holder["state"])) if callable(state_fn) else None,
        is_chief=bool(getattr(backend, "is_chief", True)),
    )
    ckpt = backend.checkpointer() if plan.checkpoint is not None else None
    k_max = int(getattr(backend, "steps_per_execution", 1) or 1)
    try:
        state = backend.init_state()
        state, data_state = restore_or_start(plan, ckpt, state, ctx)
        holder["state"] = state
        batches = ctx.train_batches(data_state, shard=getattr(backend, "data_shard", (0, 1)))
        ctx.begin()
        while not ctx.done:
            k = ctx.steps_until_event(k_max) if k_max > 1 else 1
            if k == 1:
                state, metrics = backend.train_step(state, backend.put(next(batches)))
                holder["state"] = state
                ctx.record_step(metrics)
            else:
                group = stack_batches([next(batches) for _ in range(k)])
                state, metrics = backend.train_steps(state, backend.put(group))  # type: ignore[attr-defined]
                holder["state"] = state
                ctx.record_steps(metrics, k)
            if ctx.due_validation():
                current = state
                ctx.validate(lambda batch, current=current: backend.eval_batch(current, batch))
            if ckpt is not None and ctx.due_checkpoint():
                meta = ctx.checkpoint_meta()
                path = ckpt.save(ctx.step, state, meta, ctx.checkpoint_metrics())
                ctx.record_checkpoint(path)
        if ckpt is not None:
            ckpt.wait()
        artifact = ctx.finish(backend.model_op(state))
    except BaseException:
        abort_run(ctx, ckpt)
        raise
    if ckpt is not None:
        ckpt.close()
    return artifact
