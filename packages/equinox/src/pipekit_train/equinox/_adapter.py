"""`Equinox`: the adapter that runs a `Plan` with JAX, Equinox, optax and Orbax.

Everything but the step lives in core (`run_step_loop`: batching, fused groups,
validation, checkpoint schedule and retention, callbacks, writers, artifact); this
module checks the plan and builds the `EquinoxStepBackend` (`_step_backend.py`) that core drives.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import jax
import jax.numpy as jnp
import numpy as np

import equinox as eqx
from pipekit_train.core.adapter import Capabilities, ConfigError, Plan, StepAdapter, positive_int

from ._mixed_precision import DynamicLossScale, Policy
from ._model import EquinoxModelOp, apply_model
from ._optim import build_optimizer
from ._precision import native_precision
from ._sharding import ShardingSpec

if TYPE_CHECKING:
    from ._group import EquinoxGroup
    from ._step_backend import EquinoxStepBackend

__all__ = ["Equinox"]

_LOSS_SCALES: Final = ("auto", "dynamic", "none")
_GROUP_STEPS: Final = ("auto", "vmap", "sequential")


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
        group_step: how a `SeedGroup`'s members share a step: `"vmap"` (one
            `jax.vmap`ped, compiled step over their stacked states), `"sequential"`
            (each member's own compiled step in turn: bit-identical to its single run), or
            `"auto"` (the default: `"vmap"` on an accelerator, `"sequential"` on the CPU,
            where XLA runs a vmapped convolution slower than the members one by one).
    """

    name = "equinox"
    native_loaders = "a grain MapDataset, IterDataset or DataLoader"
    capabilities = Capabilities.full()

    def __init__(
        self,
        *,
        steps_per_execution: int = 1,
        precision: str | None = None,
        loss_scale: str | float = "auto",
        group_step: str = "auto",
    ):
        steps_per_execution = positive_int("steps_per_execution", steps_per_execution, example="10")
        self.steps_per_execution = int(steps_per_execution)
        self.policy: Policy
        self.policy, self.spec_precision = native_precision(precision)
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
        if group_step not in _GROUP_STEPS:
            raise ConfigError(
                f"`group_step` must be one of {list(_GROUP_STEPS)}. Received: "
                f"group_step={group_step!r}."
            )
        self.group_step = group_step

    def __repr__(self) -> str:
        group = "" if self.group_step == "auto" else f", group_step={self.group_step!r}"
        return f"Equinox(steps_per_execution={self.steps_per_execution}, precision={self.precision!r}, loss_scale={self.loss_scale!r}{group})"

    def get_config(self) -> dict[str, Any]:
        """`{"type": "pipekit_train.equinox:Equinox", "kwargs": {...}}` (JSON)."""
        kwargs: dict[str, Any] = {
            "steps_per_execution": self.steps_per_execution,
            "precision": self.precision,
            "loss_scale": self.loss_scale,
        }
        if self.group_step != "auto":  # the config of every other run stays as it was
            kwargs["group_step"] = self.group_step
        return {"type": "pipekit_train.equinox:Equinox", "kwargs": kwargs}

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
        from ._data import is_native_loader

        return is_native_loader(data)

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
        if plan.rollout is not None and getattr(plan.model, "model_state", None) is not None:
            raise ConfigError(
                "Rollout training does not carry layer state (e.g. BatchNorm statistics) "
                "through the unrolled steps yet. Received: a model with layer state and "
                f"rollout=Rollout(steps={plan.rollout.steps}). Use a model without layer "
                "state (e.g. eqx.nn.LayerNorm in place of BatchNorm: it keeps no running "
                "statistics), or drop `rollout`."
            )
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

    def check_native_data(self, field: str, data: Any, plan: Plan) -> None:
        """A grain loader: single-process only, batches with `x` and `y`."""
        if jax.process_count() > 1:
            raise ConfigError(
                f"A grain `{field}` is not supported in a multi-process run: each process "
                "would read the whole loader. Received: "
                f"{field}={type(data).__name__}, processes={jax.process_count()}. "
                "Use a pipekit dataset (core shards it per process)."
            )
        from ._data import check_first_batch

        check_first_batch(data, field)

    # -- shape probe -------------------------------------------------------------------
    def output_shape(
        self, model: Any, input_shape: tuple[int, ...], dtype: Any = np.float32
    ) -> tuple[int, ...] | None:
        """The prediction's shape, from `eqx.filter_eval_shape` (abstract: no FLOPs, no weights).

        The model runs as in evaluation (`apply_model` in inference mode: vmapped per
        sample unless `batched`, permuted at its boundary for `layout="channels_last"`); a model that cannot take such inputs raises JAX's error.
        """
        if not isinstance(model, EquinoxModelOp):
            return None
        x = jax.ShapeDtypeStruct(tuple(input_shape), jax.dtypes.canonicalize_dtype(dtype))
        batched, layout = model.batched, model.layout

        def forward(net: Any, state: Any, x: Any) -> Any:
            net = eqx.nn.inference_mode(net)
            return apply_model(net, x, state, None, batched=batched, layout=layout)[0]

        out = eqx.filter_eval_shape(forward, model.model, model.model_state, x)
        shape = getattr(out, "shape", None)
        return None if shape is None else tuple(int(d) for d in shape)

    def stepper_shape(
        self, stepper: Any, state_shape: tuple[int, ...], dtype: Any = np.float32
    ) -> tuple[int, ...] | None:
        """The stepper's output shape on a batch of `state_shape`, from `jax.eval_shape`
        (abstract: no FLOPs)."""
        x = jax.ShapeDtypeStruct(tuple(state_shape), jax.dtypes.canonicalize_dtype(dtype))
        shape = getattr(jax.eval_shape(stepper, x), "shape", None)
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
    def step_backend(self, plan: Plan) -> EquinoxStepBackend:
        """The `StepBackend` for `run_step_loop` and `OnlineTrainer`."""
        from ._step_backend import EquinoxStepBackend

        return EquinoxStepBackend(plan, self)

    def group_backend(self, plans: Sequence[Plan]) -> EquinoxGroup:
        """The step of a `SeedGroup`'s members (`_group.EquinoxGroup`): one `jax.vmap`ped,
        compiled step over their stacked states, or each member's own step in turn
        (`group_step`); each member keeps its own `EquinoxStepBackend`."""
        from ._group import EquinoxGroup

        mode = self.group_step
        vectorize = jax.default_backend() != "cpu" if mode == "auto" else mode == "vmap"
        return EquinoxGroup([self.step_backend(plan) for plan in plans], vectorize=vectorize)
