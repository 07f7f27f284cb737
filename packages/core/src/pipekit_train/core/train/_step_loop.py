"""The step loop: the whole training loop for backends that expose a train step.

Step-based adapters (`StepAdapter`: the numpy reference adapter, Equinox, `Torch()`)
implement a `StepBackend` and get batching, fused multi-step execution, validation,
checkpoint/resume, preemption, time budgets, callbacks, writers and the artifact from
here: `run_step_loop` only feeds batches to the backend; `RunLifecycle` owns everything
around the steps.
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pipekit_train.core.artifact._artifact import TrainingArtifact
from pipekit_train.core.contract._adapter import Adapter, Capabilities, StepBackend
from pipekit_train.core.run._lifecycle import RunLifecycle
from pipekit_train.core.run._prefetch import Prefetcher
from pipekit_train.core.spec._plan import Plan

if TYPE_CHECKING:
    from ._group_loop import GroupStepBackend

__all__ = ["StepAdapter", "run_step_loop", "stack_batches"]


def stack_batches(batches: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Stack K batches into one dict of arrays with a leading axis of size K."""
    return {key: np.stack([b[key] for b in batches]) for key in batches[0]}


def run_step_loop(plan: Plan, backend: StepBackend[Any]) -> TrainingArtifact:
    """Run a whole training loop on a `StepBackend` and return the artifact.

    Raises:
        Preempted: a preemption signal arrived; the step it reached is checkpointed.
    """
    holder: dict[str, Any] = {}
    with RunLifecycle(
        plan,
        checkpointer=backend.checkpointer() if plan.checkpoint is not None else None,
        fetch=backend.fetch,
        learning_rate=lambda: backend.learning_rate(holder["state"]),
        is_chief=bool(backend.is_chief),
        processes=int(backend.data_shard[1]),
        agree=getattr(backend, "agree", None),
    ) as run:
        depth = max(0, int(getattr(backend, "prefetch", 0)))
        state, batches = run.start(
            backend.init_state(),
            shard=backend.data_shard,
            native=lambda data_state: backend.native_batches(plan.data, data_state),
            track=depth > 0,  # a prefetching thread reads ahead of training
        )
        holder["state"] = state

        def rescale(scale: float) -> None:
            holder["state"] = backend.with_lr_scale(holder["state"], scale)

        run.bind(
            state=lambda: holder["state"],
            eval_batch=lambda batch: backend.eval_batch(holder["state"], batch),
            eval_batches=backend.native_eval_batches,
            lr_scale=rescale,
            agree=getattr(backend, "agree", None),
        )
        run.begin()
        k_max = max(1, int(backend.steps_per_execution))
        micro = plan.accumulate_grad_batches
        take = _batch_source(backend, batches, k_max, micro, depth)
        try:
            while not run.done:
                state = holder["state"]
                k = run.steps_until_event(k_max) if k_max > 1 else 1
                if k == 1 and micro == 1:
                    state, metrics = backend.train_step(state, take(1))
                else:
                    # k updates of `micro` accumulated batches each, in one call
                    state, metrics = backend.train_steps(state, take(k))
                holder["state"] = state
                run.end_of_update(metrics, k, micro=micro)
        finally:
            close = getattr(take, "close", None)
            if close is not None:
                close()
        final = run.final_state(holder["state"])  # the best checkpoint's, with restore_best
        return run.finish(backend.model_op(final), raw_model=backend.raw_model_op(final))


_DEVICE_STACK_BYTES = 8 << 20
"""Fused groups from this size on are copied batch by batch on the prefetching thread and
stacked on the device; smaller ones are stacked on the host and copied once (one copy of a
small group costs less than a copy per batch)."""


class _Source:
    """`take(k)`: the device value of the next `k` updates' batches (see `_batch_source`)."""

    def __init__(self, take: Callable[[int], Any], close: Callable[[], None] | None = None):
        self._take = take
        self.close = close

    def __call__(self, k: int) -> Any:
        return self._take(k)


def _batch_source(
    backend: StepBackend[Any], batches: Any, k_max: int, micro: int, depth: int
) -> _Source:
    """Where the loop takes its batches: straight from the feed (`depth=0`), or from a
    thread that prepares them `depth` groups ahead (`StepBackend.prefetch`).

    With one update per call the thread also copies each group to the device (its size is
    always `micro`); with fused calls, whose size the schedule decides per call, it copies
    every batch alone and the backend stacks them on the device (`StepBackend.stack`) when
    a group is large (`_DEVICE_STACK_BYTES`), or it prepares the host batches and the loop
    stacks and copies them.
    """

    def group(k: int, source: Any) -> Any:
        if k == 1 and micro == 1:
            return backend.put(next(source))
        return backend.put(stack_batches([next(source) for _ in range(k * micro)]))

    if depth == 0:
        return _Source(lambda k: group(k, batches))
    if k_max == 1:

        def make(host: Sequence[Mapping[str, np.ndarray]]) -> Any:
            return backend.put(host[0] if micro == 1 else stack_batches(host))

        ahead = Prefetcher(batches, make, size=micro, depth=depth)
        return _Source(lambda k: next(ahead), ahead.close)
    first = next(batches)
    batches = itertools.chain([first], batches)  # the feed has counted it: it comes first
    group_bytes = sum(np.asarray(v).nbytes for v in first.values()) * k_max * micro
    if group_bytes >= _DEVICE_STACK_BYTES and type(backend).stack is not StepBackend.stack:
        # a large group: every batch copied on the thread, stacked on the device
        singles = Prefetcher(
            batches, lambda host: backend.put(host[0]), size=1, depth=depth * k_max * micro
        )
        return _Source(
            lambda k: backend.stack([next(singles) for _ in range(k * micro)]), singles.close
        )
    hosts = Prefetcher(batches, lambda host: host[0], size=1, depth=depth * k_max * micro)
    return _Source(lambda k: group(k, hosts), hosts.close)


class StepAdapter(Adapter):
    """An adapter whose whole loop is core's `run_step_loop` over its `StepBackend`.

    Subclasses implement `step_backend(plan)` (and `get_config`); `run` is provided.
    """

    capabilities: ClassVar[Capabilities] = Capabilities(online=True)

    @abc.abstractmethod
    def step_backend(self, plan: Plan) -> StepBackend[Any]:
        """The `StepBackend` of one run."""

    def run(self, plan: Plan) -> TrainingArtifact:
        """Train with core's step loop and return the artifact."""
        return run_step_loop(plan, self.step_backend(plan))

    def group_backend(self, plans: Sequence[Plan]) -> GroupStepBackend[Any, Any]:
        """The `GroupStepBackend` of a `SeedGroup`'s member plans (backends that declare
        `Capabilities.seed_groups`)."""
        raise self._unsupported(
            "Training seeds in one program (SeedGroup)",
            f"adapter={self!r}",
            "Train each seed as its own TrainingLoop.",
        )

    def run_group(self, plans: Sequence[Plan]) -> list[TrainingArtifact]:
        """Train a `SeedGroup`'s members in lockstep with core's group loop (backends that
        declare `Capabilities.seed_groups`; the others: one after another)."""
        if not self.capabilities.seed_groups:
            return super().run_group(plans)
        from ._group_loop import run_group_loop

        return run_group_loop(plans, self.group_backend(plans))
