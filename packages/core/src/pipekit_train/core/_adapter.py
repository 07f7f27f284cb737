"""The `Adapter` contract: how a backend runs a frozen `Plan`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ._artifact import TrainingArtifact
    from ._plan import Plan

__all__ = ["Adapter"]


class Adapter(Protocol):
    """A training backend.

    An adapter knows how to build the backend model and optimizer, run a train step and
    an eval step, move a numpy batch onto its device and save/restore state. Everything
    else (batching, callback dispatch, writer routing, validation and checkpoint
    schedules, retention, history, artifact assembly) comes from core: step-based
    backends call `pipekit_train.core.run_step_loop`; backends with their own loop drive a
    `pipekit_train.core.RunContext` from their hooks.

    Attributes:
        name: the backend name recorded in plans and artifacts.
    """

    name: str

    def validate(self, plan: Plan) -> None:
        """Raise `ConfigError` for anything in the plan this backend cannot run.

        Called by `TrainingLoop` at construction, before any work is done.
        """
        ...

    def run(self, plan: Plan) -> TrainingArtifact:
        """Train according to the plan and return the artifact."""
        ...

    def get_config(self) -> dict[str, Any]:
        """JSON description of the adapter's options (recorded in the plan)."""
        ...
