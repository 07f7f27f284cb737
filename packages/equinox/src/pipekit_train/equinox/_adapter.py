"""`Equinox`: the adapter that runs a `Plan` with JAX, Equinox, optax and Orbax.

Everything but the step lives in core (`run_step_loop`: batching, fused groups,
validation, checkpoint schedule and retention, callbacks, writers, artifact); this
module provides the `StepBackend`: build the state, place batches, run the compiled
steps, evaluate, checkpoint.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

import jax
import jax.numpy as jnp
import numpy as np

import equinox as eqx
from pipekit_train.core import ConfigError
from pipekit_train.core.adapter import PRECISIONS as SPEC_PRECISIONS
from pipekit_train.core.adapter import (
    Capabilities,
    Plan,
    StepAdapter,
    StepBackend,
    is_core_dataset,
)

from ._checkpoint import OrbaxCheckpointer, abstract_of
from ._model import EquinoxModelOp, _host_array, apply_model, has_stochastic_layers, takes_key
from ._optim import build_optimizer
from ._precision import DynamicLossScale, Policy, parse_policy
from ._sharding import Placement, ShardingSpec
from ._state import FlatState, TrainState
from ._step import flatten_state, step_functions

__all__ = ["Equinox", "EquinoxBackend"]

_LOSS_SCALES: Final = ("auto", "dynamic", "none")

# core's precision vocabulary (and its common spellings) -> jmp policy strings
_POLICIES: Final[dict[str, str | None]] = {
    "float32": None,
    "32-true": None,
    "bfloat16-mixed": "params=float32,compute=bfloat16,output=float32",
    "bf16-mixed": "params=float32,compute=bfloat16,output=float32",
    "mixed_bfloat16": "params=float32,compute=bfloat16,output=float32",
    "float16-mixed": "params=float32,compute=float16,output=float32",
    "16-mixed": "params=float32,compute=float16,output=float32",
    "mixed_float16": "params=float32,compute=float16,output=float32",
}


class Equinox(StepAdapter):
    """The Equinox/JAX training adapter (`backend = "equinox"`).

    ```python
    TrainingLoop(model=EquinoxModelOp(...), ..., adapter=Equinox(steps_per_execution=10))
    ```

    Args:
        steps_per_execution: fuse up to this many optimizer steps into one compiled call
            (`jax.lax.scan` over stacked batches). Validation, checkpoints and the end
            of the run still land on the same steps as with 1, and the results match.
            Callbacks still see every step.
        precision: `"float32"` (the default), `"bfloat16-mixed"` or `"float16-mixed"`
            (core's vocabulary, the same on every backend), or a jmp policy string such as
            `"params=float32,compute=bfloat16,output=float32"`.
        loss_scale: `"auto"` (dynamic loss scaling when computing in float16), `"dynamic"`,
            `"none"`, or a number (a fixed scale). Steps whose gradients are not finite
            are skipped whenever a loss scale is used.
    """

    name = "equinox"
    native_loaders = "a grain MapDataset, IterDataset or DataLoader"
    capabilities = Capabilities(
        native_data=True,
        online=True,
        fused_steps=True,
        sharding=True,
        accumulation=True,
        precisions=SPEC_PRECISIONS,
        skip_nonfinite=True,
    )

    def __init__(
        self,
        *,
        steps_per_execution: int = 1,
        precision: str | None = None,
        loss_scale: str | float = "auto",
    ):
        if (
            isinstance(steps_per_execution, bool)
            or not isinstance(steps_per_execution, (int, np.integer))
            or steps_per_execution < 1
        ):
            raise ConfigError(
                "`steps_per_execution` must be a positive int. "
                f"Received: steps_per_execution={steps_per_execution!r}."
            )
        self.steps_per_execution = int(steps_per_execution)
        self.policy: Policy = parse_policy(_POLICIES.get(str(precision), precision))
        self.precision = None if precision is None else str(self.policy)
        if isinstance(loss_scale, str):
            if loss_scale.lower() not in _LOSS_SCALES:
                raise ConfigError(
                    f"`loss_scale` must be one of {list(_LOSS_SCALES)} or a positive number. "
                    f"Received: loss_scale={loss_scale!r}."
                )
            loss_scale = loss_scale.lower()
        elif (
            isinstance(loss_scale, bool)
            or not isinstance(loss_scale, (int, float))
            or not np.isfinite(loss_scale)
            or loss_scale <= 0
        ):
            raise ConfigError(
                f"`loss_scale` must be one of {list(_LOSS_SCALES)} or a positive number. Received: loss_scale={loss_scale!r}."
            )
        self.loss_scale: str | float = loss_scale

    def __repr__(self) -> str:
        return f"Equinox(steps_per_execution={self.steps_per_execution}, precision={self.precision!r}, loss_scale={self.loss_scale!r})"

    def get_config(self) -> dict[str, Any]:
        """`{"type": "pipekit_train.equinox:Equinox", "kwargs": {...}}` (JSON)."""
        return {
            "type": "pipekit_train.equinox:Equinox",
            "kwargs": {
                "steps_per_execution": self.steps_per_execution,
                "precision": self.precision,
                "loss_scale": self.loss_scale,
            },
        }

    def make_loss_scale(self) -> DynamicLossScale | None:
        """The loss scale a run starts with (None when not scaling)."""
        mode = self.loss_scale
        if mode == "none" or (mode == "auto" and self.policy.compute != jnp.float16):
            return None
        if isinstance(mode, (int, float)):
            return DynamicLossScale.create(
                float(mode), period=2**31 - 1, factor=1.0, min_scale=float(mode)
            )
        return DynamicLossScale.create()

    # -- data --------------------------------------------------------------------------
    def accepts_data(self, data: Any) -> bool:
        """Whether `data` is a grain `MapDataset`, `IterDataset` or `DataLoader`.

        Their elements must be batches: dicts of numpy arrays with `"x"` and `"y"` (e.g.
        `grain.MapDataset.source(samples).shuffle(seed=0).batch(32, drop_remainder=True)`).
        A `MapDataset` is repeated over epochs; the grain iterator's state goes into every
        checkpoint, so a resume is exact.
        """
        if "grain" not in sys.modules:  # a grain object means grain was imported
            return False
        from ._native import is_grain_loader

        return is_grain_loader(data)

    # -- validation --------------------------------------------------------------------
    def validate_online(self, plan: Plan) -> None:
        """Checks shared by `TrainingLoop` and `OnlineTrainer`: the model and optimizer."""
        model = plan.model
        if not isinstance(model, EquinoxModelOp):
            raise ConfigError(
                "The Equinox adapter trains `EquinoxModelOp` models. "
                f"Received: model={type(model).__name__}. Wrap the module factory: "
                "EquinoxModelOp('module:factory', **kwargs)."
            )
        build_optimizer(plan.optimizer_config)

    def validate(self, plan: Plan) -> None:
        """Raise `ConfigError` for anything this adapter cannot run (before any work)."""
        self.validate_online(plan)
        sharding = plan.sharding
        if sharding is not None:
            if not isinstance(sharding, ShardingSpec):
                raise ConfigError(
                    "`sharding` must be a pipekit_train.equinox.ShardingSpec. "
                    f"Received: sharding={sharding!r}. Use ShardingSpec(mesh, model_pspec, data_pspec)."
                )
            sharding.validate(plan.batch_size)
        elif jax.process_count() > 1:
            raise ConfigError(
                f"A multi-process run ({jax.process_count()} processes) needs `sharding=ShardingSpec(mesh)`. "
                "Received: sharding=None."
            )
        super().validate(plan)

    def check_native_data(self, field: str, data: Any, plan: Plan) -> None:
        """A grain loader: single-process only, batches with `x` and `y`."""
        if jax.process_count() > 1:
            raise ConfigError(
                f"A grain `{field}` is not supported in a multi-process run: each process "
                "would read the whole loader. Received: "
                f"{field}={type(data).__name__}, processes={jax.process_count()}. "
                "Use a pipekit dataset (core shards it per process)."
            )
        from ._native import check_first_batch

        check_first_batch(data, field)

    # -- shape probe -------------------------------------------------------------------
    def output_shape(
        self, model: Any, input_shape: tuple[int, ...], dtype: Any = np.float32
    ) -> tuple[int, ...] | None:
        """The prediction's shape, from `eqx.filter_eval_shape` (abstract: no FLOPs, no weights).

        The model runs as in evaluation (`apply_model` in inference mode: vmapped per
        sample unless `batched`); a model that cannot take such inputs raises JAX's error.
        """
        if not isinstance(model, EquinoxModelOp):
            return None
        x = jax.ShapeDtypeStruct(tuple(input_shape), jax.dtypes.canonicalize_dtype(dtype))
        batched = model.batched

        def forward(net: Any, state: Any, x: Any) -> Any:
            return apply_model(eqx.nn.inference_mode(net), x, state, None, batched=batched)[0]

        out = eqx.filter_eval_shape(forward, model.model, model.model_state, x)
        shape = getattr(out, "shape", None)
        return None if shape is None else tuple(int(d) for d in shape)

    def expected_input_shape(self, model: Any) -> tuple[int, ...] | None:
        """`(in,)` of a per-sample `eqx.nn.MLP` or `eqx.nn.Linear` (None for other modules)."""
        if not isinstance(model, EquinoxModelOp) or model.batched:
            return None
        net = model.model
        size = getattr(net, "in_size", None) if isinstance(net, eqx.nn.MLP) else None
        if isinstance(net, eqx.nn.Linear):
            size = net.in_features
        if isinstance(size, int):
            return (size,)
        return () if size == "scalar" else None

    # -- running -----------------------------------------------------------------------
    def step_backend(self, plan: Plan) -> EquinoxBackend:
        """The `StepBackend` for `run_step_loop` and `OnlineTrainer`."""
        return EquinoxBackend(plan, self)


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


class EquinoxBackend(StepBackend[FlatState]):
    """The `StepBackend` of one run (see `pipekit_train.core.StepBackend`).

    The state it hands around is a `FlatState` (the `TrainState`'s array leaves);
    `train_state(state)` rebuilds the `TrainState`.
    """

    name: Final = "equinox"

    def __init__(self, plan: Plan, adapter: Equinox):
        self.plan = plan
        self.adapter = adapter
        self.op: EquinoxModelOp = plan.model
        self.optimizer = build_optimizer(
            plan.optimizer_config, accumulate=plan.accumulate_grad_batches
        )
        self.policy = adapter.policy
        self.placement = Placement(plan.sharding)
        self.steps_per_execution = adapter.steps_per_execution
        multi = self.placement.multiprocess
        self.data_shard = (jax.process_index(), jax.process_count()) if multi else (0, 1)
        self.is_chief = jax.process_index() == 0
        self._template = self._host_state()
        self._names = _leaf_names(self._template)
        self._step_index = self._names.index("step")
        shardings = None
        if plan.sharding is not None:
            shardings = self.placement.state_shardings(self._template, self.optimizer.transform)
        self._shardings = shardings
        model = self._template.model
        self.fns = step_functions(
            self._template,
            optimizer_key=self.optimizer.cache_key(plan.optimizer_config),
            loss_fn=plan.loss,
            optimizer=self.optimizer.transform,
            policy=self.policy,
            batched=self.op.batched,
            use_key=takes_key(model) and has_stochastic_layers(model),
            state_shardings=shardings,
            data_sharding=self.placement.data_sharding,
            stacked_sharding=self.placement.stacked_sharding,
            replicated=self.placement.replicated,
            skip_nonfinite=plan.on_nonfinite == "skip",
            accumulate=plan.accumulate_grad_batches,
        )
        self._copy = (
            _copy_leaves if shardings is None else jax.jit(_fresh_copies, out_shardings=shardings)
        )
        self._stack_rank = self._sample_rank(plan.data)

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
        from ._native import GrainBatches

        return GrainBatches(data, data_state)

    def native_eval_batches(self, data: Any) -> Iterator[Mapping[str, np.ndarray]]:
        """One pass over a grain validation loader."""
        from ._native import eval_batches

        return eval_batches(data)

    def put(self, batch: Mapping[str, np.ndarray]) -> Any:
        """A batch (or K stacked batches) ready for the step, moved to the device(s) once.

        In one process the numpy batch goes to the compiled step as is, which transfers
        it (split per `data_pspec`) on dispatch; in a multi-process run the global batch
        is assembled here with `jax.make_array_from_process_local_data`.
        """
        if not self.placement.multiprocess:
            return batch
        stacked = self._stack_rank is not None and np.ndim(batch["x"]) == self._stack_rank + 2
        return self.placement.put_batch(batch, stacked=stacked)

    def fetch(self, values: Sequence[Any]) -> list[Any]:
        """Device values to the host in one `jax.device_get`."""
        return jax.device_get(list(values))

    # -- steps -------------------------------------------------------------------------
    def train_step(self, state: FlatState, batch: Any) -> tuple[FlatState, dict[str, Any]]:
        """One optimizer step; the metrics stay on the device."""
        leaves, metrics = self.fns.train_step(state.leaves, batch)
        return FlatState(leaves), metrics

    def train_steps(self, state: FlatState, stacked: Any) -> tuple[FlatState, dict[str, Any]]:
        """K fused steps over K stacked batches; metrics of shape `(K,)`."""
        leaves, metrics = self.fns.train_steps(state.leaves, stacked)
        return FlatState(leaves), metrics

    def eval_batch(self, state: FlatState, batch: Mapping[str, np.ndarray]) -> tuple[Any, Any]:
        """`(predictions, mean loss)` in inference mode on one validation batch."""
        return self.fns.eval_batch(state.leaves, self.placement.put_replicated(batch))

    def learning_rate(self, state: FlatState) -> float | None:
        """The learning rate of the next step (None for an optimizer object)."""
        if self.optimizer.schedule is None:
            return None
        # the state counts batches; with accumulation an update takes several
        batches = int(jax.device_get(state.leaves[self._step_index]))
        return self.optimizer.learning_rate(batches // self.optimizer.accumulate)

    def model_op(self, state: FlatState) -> EquinoxModelOp:
        """The trained operator (host copies of the weights: later steps may donate them)."""
        ts = self.train_state(state)
        model = jax.tree.map(_host_array, ts.model)
        mstate = None if ts.model_state is None else jax.tree.map(_host_array, ts.model_state)
        return self.op.with_model(model, mstate)

    # -- checkpoints -------------------------------------------------------------------
    def _to_tree(self, state: FlatState) -> dict[str, Any]:
        return dict(zip(self._names, self._copy(state.leaves), strict=True))

    def _live_tree(self, state: FlatState) -> dict[str, Any]:
        return dict(zip(self._names, state.leaves, strict=True))

    def _template_tree(self, template: FlatState) -> dict[str, Any]:
        return abstract_of(dict(zip(self._names, template.leaves, strict=True)))

    def _from_tree(self, tree: Mapping[str, Any], template: FlatState) -> FlatState:
        return FlatState([tree[name] for name in self._names])

    def checkpointer(self) -> OrbaxCheckpointer:
        """An Orbax checkpointer for `plan.checkpoint`."""
        if self.plan.checkpoint is None:
            raise ConfigError(
                "checkpointer() needs `checkpoint=Checkpoint(...)`. Received: checkpoint=None."
            )
        return OrbaxCheckpointer(
            self.plan.checkpoint,
            to_tree=self._to_tree,
            template_tree=self._template_tree,
            from_tree=self._from_tree,
            live_tree=self._live_tree,
        )

    def __repr__(self) -> str:
        return f"EquinoxBackend({self.adapter!r}, arrays={len(self._names)})"
