"""The group loop: the members of a `SeedGroup` trained in lockstep by one step.

Each member is a whole run of its own — a `RunLifecycle` with its plan (seed, model seed,
checkpoint location), its data order, its validation, its checkpoints and its artifact —
so a member's checkpoints are those of its single run. What the members share is the
step: a `GroupStepBackend` advances all of them in one call (Equinox: one `jax.vmap`ped,
compiled step over their stacked states).

The members stop, validate, checkpoint and are preempted at the same steps: the
step-boundary flags (stop, preemption signal, time budget, time cadence) are agreed
across the members before any of them acts on one. A run killed between two members'
checkpoint commits resumes with members at different steps: the members behind train
alone (the others' lanes compute and are discarded, so every lane's arithmetic is that
of the uninterrupted group) until all are level again, and the result is the same.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import numpy as np

from pipekit_train.core.artifact._artifact import TrainingArtifact
from pipekit_train.core.contract._adapter import StepBackend
from pipekit_train.core.run._lifecycle import _PREEMPT, RunLifecycle
from pipekit_train.core.run._preemption import Preempted
from pipekit_train.core.spec._plan import Plan

__all__ = ["GroupStepBackend", "run_group_loop", "step_members"]

StateT = TypeVar("StateT")
GroupT = TypeVar("GroupT")


class GroupStepBackend(abc.ABC, Generic[StateT, GroupT]):
    """One train step over the stacked states of a group's members.

    Attributes:
        members: one `StepBackend` per member plan, in order: each builds its member's
            initial state, checkpointer, evaluator and model operator (exactly those of
            the member's single run).
    """

    members: Sequence[StepBackend[StateT]]

    @abc.abstractmethod
    def stack(self, states: Sequence[StateT]) -> GroupT:
        """The group state of the members' states (in member order)."""

    @abc.abstractmethod
    def member(self, group: GroupT, index: int) -> StateT:
        """Member `index`'s state in `group`: its own arrays, safe to save while the
        group trains on (a later step may donate the group's buffers)."""

    @abc.abstractmethod
    def train_step(
        self, group: GroupT, batch: Mapping[str, np.ndarray], active: Sequence[bool] | None
    ) -> tuple[GroupT, list[Mapping[str, Any]]]:
        """One optimizer step of every member on its batch (`batch`: the members' batches
        stacked on a leading axis); one metrics dict per member.

        `active` (None: every member) marks the members that step; the others keep their
        state exactly (their lanes' results are discarded).
        """


def step_members(
    members: Sequence[StepBackend[Any]],
    states: Sequence[Any],
    batch: Mapping[str, np.ndarray],
    active: Sequence[bool] | None,
) -> tuple[list[Any], list[Mapping[str, Any]]]:
    """The members' own train steps in turn: a `GroupStepBackend.train_step` whose group
    state is the list of member states (no batching across members; each member's
    arithmetic is its single run's). Members `active` marks False keep their state and
    report no metrics."""
    new = list(states)
    metrics: list[Mapping[str, Any]] = []
    for i, backend in enumerate(members):
        if active is not None and not active[i]:
            metrics.append({})
            continue
        new[i], m = backend.train_step(states[i], {k: v[i] for k, v in batch.items()})
        metrics.append(m)
    return new, metrics


def _agreed_flags(runs: Sequence[RunLifecycle], active: Sequence[bool]) -> list[bool]:
    """Any active member's flag raises it for all; a preemption signal counts from any
    member (the handler installed last records it)."""
    every = [run.boundary_flags() for run in runs]
    agreed = [
        any(f[k] for f, on in zip(every, active, strict=True) if on) for k in range(len(every[0]))
    ]
    agreed[_PREEMPT] = any(f[_PREEMPT] for f in every)
    return agreed


def run_group_loop(plans: Sequence[Plan], group: GroupStepBackend[Any, Any]) -> list[Any]:
    """Train the member plans in lockstep and return one `TrainingArtifact` per plan.

    Raises:
        Preempted: a preemption signal arrived; every member checkpointed the step it
            reached (the error names the last member's checkpoint).
    """
    members = list(group.members)
    n = len(plans)
    with contextlib.ExitStack() as stack:
        runs: list[RunLifecycle] = []
        holder: dict[str, Any] = {"views": {}}

        def view(i: int) -> Any:
            views = holder["views"]
            if i not in views:
                views[i] = group.member(holder["group"], i)
            return views[i]

        def rate_of(i: int) -> Callable[[], float | None]:
            return lambda: members[i].learning_rate(view(i))

        def state_of(i: int) -> Callable[[], Any]:
            return lambda: view(i)

        def evaluator_of(i: int) -> Callable[[Any], tuple[Any, Any]]:
            return lambda batch: members[i].eval_batch(view(i), batch)

        for i, (plan, backend) in enumerate(zip(plans, members, strict=True)):
            run = RunLifecycle(
                plan,
                checkpointer=backend.checkpointer() if plan.checkpoint is not None else None,
                fetch=backend.fetch,
                learning_rate=rate_of(i),
            )
            stack.enter_context(run)  # a failure aborts every member
            runs.append(run)
        states, feeds = [], []
        for run, backend in zip(runs, members, strict=True):
            state, feed = run.start(backend.init_state(), track=False)
            states.append(state)
            feeds.append(feed)
        holder["group"] = group.stack(states)
        for i, (run, backend) in enumerate(zip(runs, members, strict=True)):
            run.bind(
                state=state_of(i),
                eval_batch=evaluator_of(i),
                eval_batches=backend.native_eval_batches,
            )
        for run in runs:
            run.begin()
        while True:
            live = [i for i in range(n) if not runs[i].done]
            if not live:
                break
            low = min(runs[i].step for i in live)
            active = [i in live and runs[i].step == low for i in range(n)]
            taken = {i: next(feeds[i]) for i in range(n) if active[i]}
            filler = next(iter(taken.values()))  # a lane that does not step computes on it
            lanes = [taken.get(i, filler) for i in range(n)]
            batch = {key: np.stack([lane[key] for lane in lanes]) for key in filler}
            new, metrics = group.train_step(holder["group"], batch, None if all(active) else active)
            holder["group"], holder["views"] = new, {}
            flags = _agreed_flags(runs, active)
            for i in range(n):
                if active[i]:
                    runs[i].end_of_update(metrics[i], flags=flags)
        artifacts: list[TrainingArtifact | None] = [None] * n
        preempted: Preempted | None = None
        for i in reversed(range(n)):  # handlers come off in the reverse order they went on
            state = runs[i].final_state(view(i))
            try:
                artifacts[i] = runs[i].finish(
                    members[i].model_op(state), raw_model=members[i].raw_model_op(state)
                )
            except Preempted as err:
                preempted = preempted or err
        if preempted is not None:
            raise preempted
        stack.pop_all()
        return artifacts
