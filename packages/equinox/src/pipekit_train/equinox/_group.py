"""`EquinoxGroup`: the step of all the members of a `SeedGroup`.

Vectorized (`vectorize=True`, the default on an accelerator): the members' states (each
the flat leaf list of its single run) are stacked on a leading axis, and the single
run's step (`StepFunctions.one_step`, through its flat form) is `jax.vmap`ped over that
axis inside one `jax.jit`: one dispatch, one program, every member's own weights,
optimizer state, RNG key and batch. The per-member metrics leave the program as
separate scalars, so core's per-member bookkeeping costs no extra device call. Members
that must not step (a resume whose members stopped at different steps) are masked:
their lanes compute and `jnp.where` keeps their old state.

Sequential (`vectorize=False`, the default on the CPU): each member's own compiled step
(its single run's) in turn, dispatched asynchronously. On a CPU a vmapped convolution
with per-member weights becomes a grouped convolution that XLA runs several times slower
than the members one by one (`benchmarks/bench_seed_group.py`); the members are then
bit-identical to their single runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pipekit_train.core.adapter import ConfigError, GroupStepBackend, step_members

from ._state import FlatState
from ._step_backend import EquinoxStepBackend

__all__ = ["EquinoxGroup"]


class EquinoxGroup(GroupStepBackend[FlatState, Any]):
    """The group step over the states of `members` (see the module docstring).

    Args:
        members: one step backend per member plan.
        vectorize: one `jax.vmap`ped step over the stacked states (True), or each
            member's own step in turn (False).

    Raises:
        ConfigError: the members' states differ in structure, shapes or dtypes (a
            factory that builds another network for another seed).
    """

    def __init__(self, members: Sequence[EquinoxStepBackend], *, vectorize: bool = True):
        self.members = self._backends = list(members)
        self.vectorize = bool(vectorize)
        first = self._backends[0].fns
        for backend in self._backends[1:]:
            fns = backend.fns
            if fns is not first and (fns.treedef != first.treedef or fns.avals != first.avals):
                raise ConfigError(
                    "A SeedGroup's members must build the same network. Received: the model "
                    f"built under seed={backend.plan.seed} differs in structure or shapes from "
                    f"the one built under seed={self._backends[0].plan.seed}. Make the factory's "
                    "architecture independent of its key."
                )
        n = len(self.members)
        flat_step = jax.vmap(first._flat_step)

        def split(metrics: Mapping[str, Any]) -> list[dict[str, Any]]:
            return [{k: v[i] for k, v in metrics.items()} for i in range(n)]

        def step(leaves: list[Any], batch: Any) -> tuple[list[Any], list[dict[str, Any]]]:
            new, metrics = flat_step(leaves, batch)
            return new, split(metrics)

        def masked(
            leaves: list[Any], batch: Any, active: Any
        ) -> tuple[list[Any], list[dict[str, Any]]]:
            new, metrics = flat_step(leaves, batch)
            kept = [
                jnp.where(active.reshape((n,) + (1,) * (a.ndim - 1)), b, a)
                for a, b in zip(leaves, new, strict=True)
            ]
            return kept, split(metrics)

        self._step = jax.jit(step, donate_argnums=(0,))
        self._masked = jax.jit(masked, donate_argnums=(0,))  # compiled only when used
        self._stack = jax.jit(lambda states: [jnp.stack(xs) for xs in zip(*states, strict=True)])
        self._slicers: dict[int, Any] = {}

    def stack(self, states: Sequence[FlatState]) -> Any:
        """The members' leaves stacked on a leading axis (new buffers); sequential: the
        members' states as they are."""
        if not self.vectorize:
            return list(states)
        return list(self._stack([list(s.leaves) for s in states]))

    def member(self, group: Any, index: int) -> FlatState:
        """Member `index`'s leaves, copied out of the group (one compiled slice);
        sequential: its state."""
        if not self.vectorize:
            return group[index]
        if index not in self._slicers:
            self._slicers[index] = jax.jit(lambda leaves: [x[index] for x in leaves])
        return FlatState(list(self._slicers[index](group)))

    def train_step(
        self,
        group: Any,
        batch: Mapping[str, np.ndarray],
        active: Sequence[bool] | None,
    ) -> tuple[Any, list[Mapping[str, Any]]]:
        """One step of every (active) member on its batch (`batch`: stacked per member)."""
        if not self.vectorize:
            return step_members(self._backends, group, batch, active)
        if active is None:
            leaves, metrics = self._step(group, dict(batch))
        else:
            leaves, metrics = self._masked(group, dict(batch), np.asarray(active, bool))
        return list(leaves), metrics
