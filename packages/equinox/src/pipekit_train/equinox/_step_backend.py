"""`EquinoxStepBackend`: the `StepBackend` core's run loop drives for the Equinox adapter.

It builds the training state, places batches on the devices, runs the compiled steps
(`_compiled.py`), evaluates, and checkpoints through Orbax (`_checkpoint.py`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import jax
import jax.numpy as jnp
import numpy as np

import equinox as eqx
from pipekit_train.core.adapter import (
    ConfigError,
    Plan,
    StepBackend,
    adjusts_learning_rate,
    is_core_dataset,
    prefetch_depth,
)

from . import _checkpoint, _fetch
from ._checkpoint import OrbaxCheckpointer
from ._compiled import flatten_state, step_functions
from ._ema import ema_model, has_ema
from ._model import EquinoxModelOp, has_stochastic_layers, takes_key
from ._optim import build_optimizer
from ._rollout import RolloutLoss
from ._sharding import Placement, ShardingSpec
from ._state import FlatState, TrainState
from ._weights import host_array

if TYPE_CHECKING:
    from ._adapter import Equinox

__all__ = ["EquinoxStepBackend"]


def _fresh_copies(leaves: list[jax.Array]) -> list[jax.Array]:
    # New buffers (a bare `x` output would forward the input buffer, which a later
    # donated step deletes while an async checkpoint write may still read it).
    return [x + jnp.zeros((), x.dtype) for x in leaves]


_copy_leaves = jax.jit(_fresh_copies)


def _leaf_names(template: TrainState) -> list[str]:
    """Stable checkpoint names of the state's arrays, e.g. `model_layers_0_weight`."""
    arrays = eqx.filter(template, eqx.is_array)
    names: list[str] = []
    seen: set[str] = set()
    for path, _ in jax.tree_util.tree_flatten_with_path(arrays)[0]:
        name = re.sub(r"[^0-9A-Za-z]+", "_", jax.tree_util.keystr(path)).strip("_") or "leaf"
        base, i = name, 1
        while name in seen:
            i += 1
            name = f"{base}_{i}"
        seen.add(name)
        names.append(name)
    return names


class EquinoxStepBackend(StepBackend[FlatState]):
    """The `StepBackend` of one run (see `pipekit_train.core.StepBackend`).

    The state it hands around is a `FlatState` (the `TrainState`'s array leaves);
    `train_state(state)` rebuilds the `TrainState`.
    """

    name: Final = "equinox"

    def __init__(self, plan: Plan, adapter: Equinox):
        self.plan = plan
        self.adapter = adapter
        assert isinstance(plan.model, EquinoxModelOp)  # validate_online() checked it
        assert plan.sharding is None or isinstance(plan.sharding, ShardingSpec)  # validate()
        self.op: EquinoxModelOp = plan.model
        self.optimizer = build_optimizer(
            plan.optimizer_config,
            accumulate=plan.accumulate_grad_batches,
            lr_scale=adjusts_learning_rate(plan),
        )
        self.policy = adapter.policy
        self.placement = Placement(plan.sharding)
        self.steps_per_execution = adapter.steps_per_execution
        multi = self.placement.multiprocess
        self.data_shard = (jax.process_index(), jax.process_count()) if multi else (0, 1)
        self.is_chief = jax.process_index() == 0
        # on an accelerator a thread puts the next batches on the device while the step
        # runs (core's step loop) when they are large enough to pay; on the CPU there is
        # nothing to overlap
        accelerator = jax.default_backend() != "cpu"
        self.prefetch = prefetch_depth(plan, self.steps_per_execution) if accelerator else 0
        self._stack_fn: Any = None
        self._template = self._host_state()
        self._names = _leaf_names(self._template)
        self._step_index = self._names.index("step")
        scales = [
            i
            for i, n in enumerate(self._names)
            if n.startswith("opt_state") and n.endswith("lr_scale")
        ]
        self._scale_index: int | None = scales[-1] if self.optimizer.lr_scale else None
        shardings = None
        if plan.sharding is not None:
            shardings = self.placement.state_shardings(self._template, self.optimizer.transform)
        self._shardings = shardings
        model = self._template.model
        options: dict[str, Any] = {
            "optimizer_key": self.optimizer.cache_key(plan.optimizer_config),
            "loss_fn": plan.loss,
            "optimizer": self.optimizer.transform,
            "policy": self.policy,
            "batched": self.op.batched,
            "layout": self.op.layout,
            "use_key": takes_key(model) and has_stochastic_layers(model),
            "state_shardings": shardings,
            "data_sharding": self.placement.data_sharding,
            "stacked_sharding": self.placement.stacked_sharding,
            "replicated": self.placement.replicated,
            "skip_nonfinite": plan.on_nonfinite == "skip",
            "accumulate": plan.accumulate_grad_batches,
            "grad_norm": plan.log_grad_norm,
        }
        rollout = self._rollout_loss(plan)
        self.fns = step_functions(self._template, rollout=rollout, **options)
        # A rollout schedule of several lengths: one compiled step per length as well,
        # chosen on the host from the step counter (`_steps_for`). The step that chooses
        # on the device (`lax.switch` over the lengths, `self.fns`) stays for fused steps
        # whose updates straddle a stage boundary: on the CPU a switch around a conv
        # net's forward and backward passes cost 3-10x the fixed-length step
        # (benchmarks/bench_rollout_schedule.py).
        self._by_length: dict[int, Any] | None = None
        if rollout is not None and len(rollout.lengths) > 1:
            self._by_length = {
                k: step_functions(self._template, rollout=rollout.at_length(k), **options)
                for k in rollout.lengths
            }
        self._counted: tuple[list[Any], int] | None = None  # (leaves, their step counter)
        self._copy = (
            _copy_leaves if shardings is None else jax.jit(_fresh_copies, out_shardings=shardings)
        )
        self._stack_rank = self._sample_rank(plan.data)

    @staticmethod
    def _rollout_loss(plan: Plan) -> RolloutLoss | None:
        if plan.rollout is None:
            return None
        trajectories = getattr(plan.data, "trajectories", None)  # TrajectoryWindows (checked)
        ndim = len(trajectories.state_shape) if trajectories is not None else 1
        return RolloutLoss(
            plan.rollout,
            plan.normalizer,
            plan.loss,
            seed=plan.seed,
            accumulate=plan.accumulate_grad_batches,
            state_ndim=ndim,
            inputs=plan.inputs,
        )

    # -- state -------------------------------------------------------------------------
    def _host_state(self) -> TrainState:
        model = self.policy.cast_to_param(self.op.model)
        return TrainState.create(
            model,
            self.optimizer.transform,
            key=jax.random.PRNGKey(self.plan.seed),
            model_state=self.op.model_state,
            loss_scale=self.adapter.make_loss_scale(),
        )

    def init_state(self) -> FlatState:
        """The step-0 state on the device(s): fresh buffers, never the operator's own."""
        leaves, _, _ = flatten_state(self._template)
        return FlatState(self.placement.put_leaves(leaves, self._shardings))

    def train_state(self, state: FlatState) -> TrainState:
        """The `TrainState` of a loop state."""
        return self.fns.unflatten(state.leaves)

    # -- data --------------------------------------------------------------------------
    @staticmethod
    def _sample_rank(data: Any) -> int | None:
        if data is None or not is_core_dataset(data):
            return None
        try:
            spec = getattr(data, "element_spec", None)
            if spec is not None and "x" in spec:
                return len(spec["x"].shape)
            return int(np.ndim(data[0]["x"]))
        except Exception:
            return None

    def native_batches(
        self, data: Any, data_state: Mapping[str, Any] | None
    ) -> Iterator[Mapping[str, np.ndarray]]:
        """Endless numpy batches from a grain loader, positioned by `data_state`.

        Its `get_state()` (grain's iterator state and the epoch, as JSON) goes into every
        checkpoint, so a resumed run continues with the same batches.
        """
        from ._data import native_batches

        return native_batches(data, data_state)

    def native_eval_batches(self, data: Any) -> Iterator[Mapping[str, np.ndarray]]:
        """One pass over a grain validation loader."""
        from ._data import native_eval_batches

        return native_eval_batches(data)

    def put(self, batch: Mapping[str, np.ndarray]) -> Any:
        """A batch (or K stacked batches) ready for the step, moved to the device(s) once.

        In one process the numpy batch goes to the compiled step as is, which transfers
        it (split per `data_pspec`) on dispatch — unless single batches are prefetched (on
        an accelerator): then each is put on the device(s) here, on the prefetching thread;
        in a multi-process run the global batch is assembled here with
        `jax.make_array_from_process_local_data`.
        """
        stacked = self._stack_rank is not None and np.ndim(batch["x"]) == self._stack_rank + 2
        if not self.placement.multiprocess:
            if not self.prefetch or stacked:
                return batch
            # prefetching (an accelerator): one batch is copied here, on the prefetching
            # thread, while the device runs the current step (a small fused group stacked
            # on the host goes to the step as it is: its C++ dispatch copies it cheaper)
            return jax.device_put(dict(batch), self.placement.data_sharding)
        return self.placement.put_batch(batch, stacked=stacked)

    def stack(self, batches: Sequence[Any]) -> Any:
        """Batches already on the device(s) (prefetched one by one) stacked there, with the
        sharding of a stacked group."""
        if self._stack_fn is None:
            sharding = self.placement.stacked_sharding

            def stacked(bs: list[Any]) -> Any:
                return jax.tree.map(lambda *a: jnp.stack(a), *bs)

            if sharding is None:
                self._stack_fn = jax.jit(stacked)
            else:
                self._stack_fn = jax.jit(stacked, out_shardings=sharding)
        return self._stack_fn(list(batches))

    def fetch(self, values: Sequence[Any]) -> list[Any]:
        """Device values to the host, one transfer per device (`_fetch.fetch`)."""
        return _fetch.fetch(values)

    # -- steps -------------------------------------------------------------------------
    def _steps_for(self, leaves: list[Any], batches: int) -> tuple[Any, int]:
        """The compiled steps for the next `batches` batches from `leaves`, and the step
        counter of `leaves`.

        Without a multi-length rollout schedule: `self.fns`. With one: the step of the
        stage's fixed length when all `batches` fall in one stage, else the switching
        step. The counter is the device's (read once, a sync) unless `leaves` are the
        ones this backend's last step returned, whose counter it kept.
        """
        counted = self._counted
        if counted is not None and counted[0] is leaves:
            counter = counted[1]
        else:
            counter = int(np.asarray(jax.device_get(leaves[self._step_index])))
        assert self._by_length is not None and self.plan.rollout is not None
        m = self.plan.accumulate_grad_batches
        first = self.plan.rollout.steps_at(counter // m)
        last = self.plan.rollout.steps_at((counter + batches - 1) // m)
        return (self._by_length[first] if first == last else self.fns), counter

    def train_step(self, state: FlatState, batch: Any) -> tuple[FlatState, dict[str, Any]]:
        """One optimizer step; the metrics stay on the device."""
        if self._by_length is None:
            leaves, metrics = self.fns.train_step(state.leaves, batch)
            return FlatState(leaves), metrics
        fns, counter = self._steps_for(state.leaves, 1)
        leaves, metrics = fns.train_step(state.leaves, batch)
        self._counted = (leaves, counter + 1)
        return FlatState(leaves), metrics

    def train_steps(self, state: FlatState, stacked: Any) -> tuple[FlatState, dict[str, Any]]:
        """K fused steps over K stacked batches; metrics of shape `(K,)`."""
        if self._by_length is None:
            leaves, metrics = self.fns.train_steps(state.leaves, stacked)
            return FlatState(leaves), metrics
        batches = int(jax.tree_util.tree_leaves(stacked)[0].shape[0])
        fns, counter = self._steps_for(state.leaves, batches)
        leaves, metrics = fns.train_steps(state.leaves, stacked)
        self._counted = (leaves, counter + batches)
        return FlatState(leaves), metrics

    def eval_batch(self, state: FlatState, batch: Mapping[str, np.ndarray]) -> tuple[Any, Any]:
        """`(predictions, mean loss)` in inference mode on one validation batch."""
        return self.fns.eval_batch(state.leaves, self.placement.put_replicated(batch))

    def learning_rate(self, state: FlatState) -> float | None:
        """The learning rate of the next step, scaled (None for an optimizer object)."""
        if self.optimizer.schedule is None:
            return None
        # the state counts batches; with accumulation an update takes several
        batches = int(jax.device_get(state.leaves[self._step_index]))
        lr = self.optimizer.learning_rate(batches // self.optimizer.accumulate)
        if lr is None or self._scale_index is None:
            return lr
        return lr * float(jax.device_get(state.leaves[self._scale_index]))

    def with_lr_scale(self, state: FlatState, scale: float) -> FlatState:
        """The state with core's learning-rate scale set in the optimizer state."""
        index = self._scale_index
        if index is None:  # pragma: no cover - built with the scale for such plans
            raise ConfigError(
                "This Equinox run was built without a learning-rate scale. Received: "
                f"scale={scale!r}. Add the callback before building the loop."
            )
        old = state.leaves[index]
        value = jnp.asarray(scale, old.dtype)
        sharding = getattr(old, "sharding", None)
        if sharding is not None and self.placement.multiprocess:
            value = jax.make_array_from_callback(
                (), sharding, lambda _: np.asarray(scale, old.dtype)
            )
        elif sharding is not None:
            value = jax.device_put(value, sharding)
        leaves = list(state.leaves)
        leaves[index] = value
        return FlatState(leaves)

    def agree(self, flags: Sequence[bool]) -> Sequence[bool]:
        """Element-wise "any process" of the step-boundary flags (multi-process runs)."""
        if not self.placement.multiprocess:
            return flags
        from jax.experimental import multihost_utils

        local = np.asarray([int(bool(f)) for f in flags], dtype=np.int32)
        every = np.asarray(multihost_utils.process_allgather(local))
        anywhere = np.asarray(every.reshape(-1, len(local)).any(axis=0)).reshape(-1)
        return [bool(v) for v in anywhere.tolist()]

    def model_op(self, state: FlatState) -> EquinoxModelOp:
        """The trained operator (host copies of the weights: later steps may donate them).

        With `optimizer_config["ema"]` its trainable arrays are the moving average.
        """
        ts = self.train_state(state)
        return self._host_op(ema_model(ts.model, ts.opt_state), ts.model_state)

    def raw_model_op(self, state: FlatState) -> EquinoxModelOp | None:
        """The operator with the trained weights when `model_op` holds the average."""
        ts = self.train_state(state)
        return self._host_op(ts.model, ts.model_state) if has_ema(ts.opt_state) else None

    def _host_op(self, model: Any, model_state: Any) -> EquinoxModelOp:
        model = jax.tree.map(host_array, model)
        mstate = None if model_state is None else jax.tree.map(host_array, model_state)
        return self.op.with_model(model, mstate)

    # -- checkpoints -------------------------------------------------------------------
    def checkpointer(self) -> OrbaxCheckpointer:
        """An Orbax checkpointer for `plan.checkpoint` (`_checkpoint.checkpointer`)."""
        if self.plan.checkpoint is None:
            raise ConfigError(
                "checkpointer() needs `checkpoint=Checkpoint(...)`. Received: checkpoint=None."
            )
        return _checkpoint.checkpointer(self.plan.checkpoint, self._names, self._copy)

    def __repr__(self) -> str:
        return f"EquinoxStepBackend({self.adapter!r}, arrays={len(self._names)})"
