"""`SeedGroup`: independent runs of one training description, trained in one program."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pipekit_train.core._checks import check_seed
from pipekit_train.core._errors import ConfigError
from pipekit_train.core.artifact._artifact import TrainingArtifact
from pipekit_train.core.data.datasets._dataset import is_core_dataset
from pipekit_train.core.spec._plan import Plan

from ._training_loop import TrainingLoop

__all__ = ["SeedGroup"]


def _check_seeds(seeds: Any) -> tuple[int, ...]:
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence) or not seeds:
        raise ConfigError(
            f"`seeds` must be a non-empty list of non-negative ints. Received: seeds={seeds!r}. "
            "Use e.g. seeds=[0, 1, 2, 3, 4]."
        )
    out = tuple(check_seed(s, name=f"seeds[{i}]") for i, s in enumerate(seeds))
    repeated = sorted({s for s in out if out.count(s) > 1})
    if repeated:
        raise ConfigError(
            f"Received: seeds={list(seeds)!r}, but seed {repeated[0]} appears more than once: "
            "two members with one seed would be the same run. Give each member its own seed."
        )
    return out


def _member_location(directory: str, seed: int) -> str:
    return f"{directory.rstrip('/')}/seed-{seed}"


class SeedGroup:
    """Independent runs of one training description, one per seed, trained in one program.

    ```python
    loop = TrainingLoop(model=EquinoxModelOp("my.nets:conv", seed=0), data=windows, ...,
                        checkpoint=Checkpoint("runs/ks"))
    artifacts = SeedGroup(loop, seeds=[0, 1, 2, 3, 4]).run()
    ```

    Member `s` is the run `loop` describes with its model built under `seed=s`
    (`ModelOpBase.with_seed`) and `TrainingLoop(seed=s)`: its own initial weights, data
    order and RNG streams. On a backend that declares `Capabilities.seed_groups`
    (Equinox) the members train in lockstep in one program: one compiled step over their
    stacked states (`jax.vmap`; on the CPU each member's own step in turn, see
    `Equinox(group_step=...)`), which costs far less than S runs one after another when
    one run does not fill the device. On the other backends the members train one after
    another, each as its own run. Each member is a whole run of its own:

    - its checkpoints live under `<checkpoint location>/seed-<s>` and are those of its
      single run (the same resume key: a member's directory resumes as a single run too),
      with its own lease;
    - it validates on its own weights at the loop's schedule, and its artifact (history,
      final and best metrics, model) is the one its single run would return, equal within
      floating-point reordering (a batched convolution may sum in another order);
    - a killed group resumes exactly, even when it died between two members' checkpoint
      commits (the members behind catch up first).

    In lockstep the members stop, validate, checkpoint and are preempted at the same
    steps.

    Args:
        loop: the training description (a `TrainingLoop`, whose own `seed` is not used).
        seeds: the members' seeds, all different.

    Raises:
        ConfigError: `seeds` is empty, not ints or has repeats; the loop's model is not a
            model operator (`EquinoxModelOp`, ...); the loop has callbacks, writers, a
            native loader, sharding, gradient accumulation, fused steps or a rollout
            schedule of several lengths (not yet supported in a group).
    """

    def __init__(self, loop: TrainingLoop, seeds: Sequence[int]):
        if not isinstance(loop, TrainingLoop):
            raise ConfigError(
                f"`loop` must be a TrainingLoop. Received: loop={type(loop).__name__}. "
                "Build the training description with TrainingLoop(...) and pass it."
            )
        self.seeds = _check_seeds(seeds)
        plan = loop.plan
        adapter = plan.adapter
        self._check_plan(plan)
        model: Any = plan.model
        self.plans: tuple[Plan, ...] = tuple(
            dataclasses.replace(
                plan,
                seed=s,
                model=model.with_seed(s),
                checkpoint=None
                if plan.checkpoint is None
                else dataclasses.replace(
                    plan.checkpoint, directory=_member_location(plan.checkpoint.location, s)
                ),
                progress=plan.progress if i == 0 else False,
            )
            for i, s in enumerate(self.seeds)
        )
        for member in self.plans:
            adapter.validate(member)

    @staticmethod
    def _check_plan(plan: Plan) -> None:
        model = plan.model
        if not callable(getattr(model, "with_seed", None)):
            raise ConfigError(
                f"A SeedGroup builds each member's model under its seed, so the loop's model "
                f"must be a model operator. Received: model={type(model).__name__}. Use e.g. "
                "EquinoxModelOp('my.nets:conv', ...)."
            )
        unsupported = [
            ("callbacks", plan.callbacks, "each member's history is in its artifact"),
            ("writers", plan.writers, "each member's history is in its artifact"),
            ("sharding", plan.sharding, "train the group on one device"),
        ]
        for name, value, fix in unsupported:
            if value:
                raise ConfigError(
                    f"A SeedGroup does not take `{name}` yet. Received: {name}={value!r}. "
                    f"Drop it ({fix}), or train each seed as its own TrainingLoop."
                )
        if plan.accumulate_grad_batches != 1:
            raise ConfigError(
                "A SeedGroup does not accumulate gradients yet. Received: "
                f"accumulate_grad_batches={plan.accumulate_grad_batches}. Use 1, or a larger "
                "batch_size."
            )
        if plan.adapter.steps_per_execution != 1:
            raise ConfigError(
                "A SeedGroup does not fuse steps yet. Received: "
                f"steps_per_execution={plan.adapter.steps_per_execution}. Use 1."
            )
        if not is_core_dataset(plan.data):
            raise ConfigError(
                "A SeedGroup draws each member's batch order from its seed with core's "
                f"batching. Received: data={type(plan.data).__name__} (a native loader). Pass "
                "a core dataset (e.g. TrajectoryWindows or ArrayDataset)."
            )
        if plan.rollout is not None and len(plan.rollout.stages()) > 1:
            raise ConfigError(
                "A SeedGroup trains one rollout length for now. Received: a rollout schedule "
                f"of lengths {[k for _, k in plan.rollout.stages()]}. Use Rollout(steps=k) "
                "without a schedule."
            )

    def __len__(self) -> int:
        return len(self.seeds)

    def run(self) -> list[TrainingArtifact]:
        """Train every member (resuming each from its latest complete checkpoint, if any);
        one `TrainingArtifact` per seed, in the order of `seeds`.

        Raises:
            Preempted: a preemption signal arrived; every member checkpointed the step it
                reached, and running the group again resumes it.
        """
        return list(self.plans[0].adapter.run_group(self.plans))

    def __repr__(self) -> str:
        return f"SeedGroup(backend={self.plans[0].backend!r}, seeds={list(self.seeds)})"
