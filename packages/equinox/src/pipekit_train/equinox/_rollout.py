"""The device rollout of an `EquinoxModelOp`: the core rollout step inside one jitted loop.

Each segment of the rollout (`pipekit_train.core.rollout.RolloutPlan`) is one compiled
`lax.fori_loop` over `RolloutSpec.bind(jax.numpy)`'s step (normalise → model → head mean →
de-normalise → residual, or a draw from the predicted distribution), in inference mode:
core's `jax_rollout`, shared with Keras on jax. The loop writes the stored states into a
buffer on the device and carries the first non-finite step and member, so only the
stored states and two integers come back to the host per segment. The segment's length
is a traced value: every segment (and every later rollout of the same spec and state
shape) reuses one compilation.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import equinox as eqx
from pipekit_train.core.adapter import (
    FORCING_KEY,
    MEMBER_NOISE_KEY,
    NOISE_KEY,
    Rollout,
    RolloutSpec,
    jax_rollout,
    prepare_rollout,
    rollout_loss,
    rollout_spec_of,
)

__all__ = ["RolloutLoss", "device_rollout"]


def _float_dtype(tree: Any) -> Any:
    for leaf in jax.tree_util.tree_leaves(tree):
        if eqx.is_array(leaf) and jnp.issubdtype(leaf.dtype, jnp.floating):
            return leaf.dtype
    return jnp.float32


#: `forward(tree) -> f`: the inference function `f(batch) -> output` of a model tree.
Forward = Callable[[Any], Callable[[Any], Any]]


def device_rollout(
    tree: Any,
    forward: Forward,
    cache: dict,
    state: Any,
    n_steps: int,
    *,
    spec: RolloutSpec | None = None,
    keep: str | int = "all",
    chunk: int | None = None,
    stochastic: bool = False,
    seed: int = 0,
) -> np.ndarray:
    """Advance a batch of states `n_steps` steps on the model's device.

    Args:
        tree: the model's pytree (the module, or `(module, state)`).
        forward: builds the inference function of a tree (see `Forward`).
        cache: where compiled segments are kept (per spec, state shape, dtype, structure).
        state: as for `EquinoxModelOp.rollout`.
        n_steps: as for `EquinoxModelOp.rollout`.
        spec: as for `EquinoxModelOp.rollout`.
        keep: as for `EquinoxModelOp.rollout`.
        chunk: as for `EquinoxModelOp.rollout`.
        stochastic: as for `EquinoxModelOp.rollout`.
        seed: as for `EquinoxModelOp.rollout`.
    """
    parts = tree if isinstance(tree, tuple) else (tree,)
    held = cache.get("tree")  # the partition of the last tree (a model changes rarely)
    if (
        held is None
        or len(held[0]) != len(parts)
        or any(a is not b for a, b in zip(held[0], parts, strict=True))
    ):
        arrays, static = eqx.partition(tree, eqx.is_array)
        held = (parts, arrays, static, _float_dtype(tree), jax.tree_util.tree_structure(tree))
        cache["tree"] = held
    _, arrays, static, dtype, structure = held
    spec, x0, single, plan = prepare_rollout(
        state,
        n_steps,
        spec,
        keep,
        chunk,
        itemsize=jnp.dtype(dtype).itemsize,
        stochastic=stochastic,
        seed=seed,
    )
    return jax_rollout(
        jax,
        lambda params: forward(eqx.combine(params, static)),
        arrays,
        spec,
        x0,
        plan,
        dtype=dtype,
        cache=cache,
        cache_key=structure,
        single=single,
        stochastic=stochastic,
        seed=seed,
    )


class RolloutLoss:
    """The rollout-training loss inside the jitted step: core's `rollout_loss` in jax.

    The length `k` of an update is `rollout.steps_at(update)`, chosen on the device from
    the state's step counter (`lax.switch` over the schedule's lengths, one branch per
    length), a pure function of the checkpointed counter; the input noise arrives with
    the batch (`batch["noise"]`, drawn by core's feed from `(seed, batch index)`), so
    a resumed run continues exactly and every backend trains on the same noise. The
    unrolled steps are a Python loop under `jit` (activation memory grows linearly with
    `k`); `jax.lax.stop_gradient` cuts the gradient for pushforward and cut BPTT.

    Args:
        rollout: the `Rollout` spec.
        normalizer: the run's normalizer (or None).
        loss_fn: core's loss (`"mse"`).
        seed: the plan's seed.
        accumulate: batches per optimizer update (the counter counts batches).
        state_ndim: the axes of one state.
        inputs: the model input's layout (`plan.inputs`), None for the state alone.
    """

    def __init__(
        self,
        rollout: Rollout,
        normalizer: Any,
        loss_fn: Callable[[Any, Any], Any],
        *,
        seed: int,
        accumulate: int = 1,
        state_ndim: int = 1,
        inputs: Any = None,
    ):
        self.rollout = rollout
        self.normalizer = normalizer
        self.spec = rollout_spec_of(rollout, normalizer, state_ndim, inputs, loss_fn)
        self.loss_fn = loss_fn
        self.seed = int(seed)
        self.accumulate = int(accumulate)
        self.stages = rollout.stages()

    @property
    def lengths(self) -> list[int]:
        """The rollout lengths of the schedule's stages (one without a schedule)."""
        return [k for _, k in self.stages]

    def at_length(self, k: int) -> RolloutLoss:
        """This loss with the length fixed at `k` (the step for one stage of a schedule)."""
        fixed = copy.copy(self)
        fixed.stages = ((0, int(k)),)
        return fixed

    def cache_key(self) -> tuple[Any, ...] | None:
        """A value that names this loss for sharing compiled steps (None: do not share)."""
        norm: Any = None
        if self.normalizer is not None:
            mean, std = (
                getattr(self.normalizer, "mean", None),
                getattr(self.normalizer, "std", None),
            )
            if not (isinstance(mean, dict) and isinstance(std, dict)):
                return None
            norm = tuple(
                (k, np.asarray(mean[k]).tobytes(), np.asarray(std[k]).tobytes())
                for k in sorted(mean)
            )
        return (
            repr(sorted(self.rollout.to_json().items())),
            tuple(self.stages),  # `at_length` fixes one stage of the schedule
            self.seed,
            self.accumulate,
            self.spec.state_ndim,
            norm,
            None if self.spec.inputs is None else repr(self.spec.inputs.to_json()),
        )

    def predict(
        self,
        model_fn: Callable[[Any], Any],
        batch: Any,
        k: int,
        noise: Any = None,
        *,
        training: bool = False,
    ) -> tuple[Any, Any]:
        """`(loss, predicted targets (B, k, ...))` of a `k`-step rollout of `batch`.

        With `training=True` a diverted chain (`Rollout(target="diverted")`) compares
        each step with the reference stepper; validation compares with the trajectory.
        """
        x = batch["x"]
        rollout = self.rollout
        return rollout_loss(
            jnp,
            spec=self.spec,
            model_fn=model_fn,
            x=x,
            y=batch["y"],
            weights=self.rollout.step_weights(k),
            backprop=self.rollout.backprop,
            loss_fn=self.loss_fn,
            detach=jax.lax.stop_gradient,
            noise=noise,
            constant=lambda a: jnp.asarray(a, x.dtype),
            forcing=batch.get(FORCING_KEY),
            reference=rollout.ref_stepper if training else None,
            cut_div_chain=rollout.cut_div_chain,
            reduction=rollout.reduction if training else "mean",
            member_noise=batch.get(MEMBER_NOISE_KEY),
        )

    def train_loss(self, model_fn: Callable[[Any], Any], batch: Any, counter: Any) -> Any:
        """The loss of the batch at step counter `counter` (batches seen so far)."""
        noise = batch.get(NOISE_KEY)  # core's feed draws it (`Rollout.noise_std > 0`)
        lengths = [k for _, k in self.stages]
        if len(lengths) == 1:
            return self.predict(model_fn, batch, lengths[0], noise, training=True)[0]
        update = counter // self.accumulate
        firsts = jnp.asarray([first for first, _ in self.stages[1:]], jnp.asarray(update).dtype)
        index = jnp.sum((update >= firsts).astype(jnp.int32))
        branches = [
            (lambda k=k: self.predict(model_fn, batch, k, noise, training=True)[0]) for k in lengths
        ]
        return jax.lax.switch(index, branches)

    def eval_loss(self, model_fn: Callable[[Any], Any], batch: Any) -> tuple[Any, Any]:
        """`(predicted targets, loss)` of the longest rollout, without noise."""
        loss, pred = self.predict(model_fn, batch, self.rollout.max_steps)
        return pred, loss
