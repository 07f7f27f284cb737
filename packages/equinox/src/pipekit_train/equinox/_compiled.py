"""The compiled train and eval steps.

One `jax.jit` per function, over the flat list of the state's array leaves (the
non-array parts of the state are closed over, so nothing is hashed per call, unlike
`eqx.filter_jit`). The state argument is donated; the batch is not.
`train_steps` fuses K steps with `jax.lax.scan` over K stacked batches. On a GPU or TPU
the scan is unrolled: XLA runs a loop's control flow on the host there, one device-host
synchronisation per iteration, which cost a compute-bound model a quarter of its speed at
K=10 (issue 38); unrolled, the K steps are one straight program. On the CPU the loop
stays a loop (no synchronisation to save, and compiling K copies of the step costs time).

With `skip_nonfinite` (`TrainingLoop(on_nonfinite="skip")`) a step whose loss is not
finite keeps the model, the optimizer state and the loss scale of before the step
(`jnp.where` on every leaf, inside the compiled step: no host sync), and layer state is
not updated from that batch; the step counter and the PRNG key still advance. With
gradient accumulation (`optax.MultiSteps`, `accumulate` batches per update) the update
is dropped when any of its batches has a non-finite loss: `train_steps` then scans
updates, each a scan over its batches, and restores the model and optimizer state of
the update's start (accumulated gradients and the update count included).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, PyTree

import equinox as eqx
from pipekit_train.core.adapter import evaluates_as_rollout

from ._ema import ema_model
from ._grad_norm import GRAD_NORM, grad_norm
from ._mixed_precision import Policy, all_finite
from ._model import apply_model
from ._state import TrainState

__all__ = ["StepFunctions", "flatten_state", "step_functions"]

Batch = Mapping[str, Array]
Metrics = dict[str, Array]


def flatten_state(state: TrainState) -> tuple[list[jax.Array], Any, Any]:
    """`(array leaves, treedef of the array part, non-array part)` of a state."""
    arrays, static = eqx.partition(state, eqx.is_array)
    leaves, treedef = jax.tree.flatten(arrays)
    return leaves, treedef, static


def _keep_dtypes(new: PyTree, old: PyTree) -> PyTree:
    """`new` with the dtypes of `old` (layer state under a lower compute precision)."""
    return jax.tree.map(
        lambda n, o: n.astype(o.dtype) if eqx.is_array(n) and n.dtype != o.dtype else n, new, old
    )


def _select(pred: Array, on_true: PyTree, on_false: PyTree) -> PyTree:
    return jax.tree.map(
        lambda a, b: jnp.where(pred, a, b) if eqx.is_array(a) else a, on_true, on_false
    )


class StepFunctions:
    """Builds and holds the jitted `train_step`, `train_steps` and `eval_batch`.

    Args:
        template: a `TrainState` with the structure every call will have.
        loss_fn: `loss(pred, target) -> scalar`, traced inside the step.
        optimizer: the optax transform (`init`/`update`).
        policy: the precision policy.
        batched: the model takes a whole batch (else it is vmapped).
        layout: the operator's `layout` (`"channels_last"`: permute at the model's boundary).
        use_key: pass a fresh per-step key to the model (dropout).
        state_shardings: the shardings of the state leaves (None: single device).
        data_sharding: the sharding of a training batch.
        stacked_sharding: the sharding of K stacked training batches.
        replicated: the sharding of scalar outputs and evaluation batches.
        skip_nonfinite: drop the update of a step whose loss is not finite.
        accumulate: batches per update (the optimizer is an `optax.MultiSteps`).
        grad_norm: add the metric `grad_norm` (the global norm of the gradient before
            clipping; with accumulation, each batch reports the norm of the running mean
            of its update's gradients, so the update's last batch holds the norm of the
            gradient the update applies, the value core records).
        rollout: a `RolloutLoss` (`_rollout.py`): the step minimises the rollout loss and
            evaluation rolls out the longest length (None: one-step training).
    """

    def __init__(
        self,
        template: TrainState,
        *,
        loss_fn: Callable[[Any, Any], Any],
        optimizer: Any,
        policy: Policy,
        batched: bool,
        use_key: bool,
        state_shardings: list[Any] | None = None,
        data_sharding: Any = None,
        stacked_sharding: Any = None,
        replicated: Any = None,
        skip_nonfinite: bool = False,
        accumulate: int = 1,
        grad_norm: bool = False,
        rollout: Any = None,
        layout: str | None = None,
    ):
        self.rollout = rollout
        self.layout = layout
        leaves, self.treedef, self.static = flatten_state(template)
        self.grad_norm = bool(grad_norm)
        self.skip_nonfinite = bool(skip_nonfinite)
        self.accumulate = int(accumulate)
        self.avals = [(x.shape, x.dtype) for x in leaves]
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.policy = policy
        self.batched = batched
        self.use_key = use_key
        if state_shardings is None:
            step_kw: dict[str, Any] = {}
            steps_kw: dict[str, Any] = {}
            eval_kw: dict[str, Any] = {}
        else:
            # Numpy batches are placed by the jitted call itself (the C++ fast path).
            out = (state_shardings, replicated)
            step_kw = {"in_shardings": (state_shardings, data_sharding), "out_shardings": out}
            steps_kw = {"in_shardings": (state_shardings, stacked_sharding), "out_shardings": out}
            eval_kw = {
                "in_shardings": (state_shardings, replicated),
                "out_shardings": (replicated, replicated),
            }
        self.train_step = jax.jit(self._flat_step, donate_argnums=(0,), **step_kw)
        self.train_steps = jax.jit(self._flat_steps, donate_argnums=(0,), **steps_kw)
        self.eval_batch = jax.jit(self._flat_eval, **eval_kw)

    # -- structure ---------------------------------------------------------------------
    def unflatten(self, leaves: list[Any]) -> TrainState:
        """The `TrainState` of a flat leaf list."""
        return eqx.combine(jax.tree.unflatten(self.treedef, leaves), self.static)

    def flatten(self, state: TrainState) -> list[Any]:
        """The flat leaf list of a `TrainState` (structure and dtypes checked)."""
        leaves, treedef, _ = flatten_state(state)
        if treedef != self.treedef:
            raise TypeError(
                "The train step changed the structure of the state (a leaf became or stopped "
                f"being an array): {treedef} != {self.treedef}."
            )
        for leaf, (shape, dtype) in zip(leaves, self.avals, strict=True):
            if leaf.shape != shape or leaf.dtype != dtype:
                raise TypeError(
                    f"The train step changed a state leaf from {dtype}{list(shape)} to "
                    f"{leaf.dtype}{list(leaf.shape)}; keep parameters and layer state in their dtype."
                )
        return leaves

    # -- the step ----------------------------------------------------------------------
    def _forward(self, model: Any, x: Array, model_state: Any, key: Any) -> tuple[Array, Any]:
        policy = self.policy
        if not policy.is_full:
            model = policy.cast_to_compute(model)
            x = policy.cast_to_compute(x)
        pred, new_state = apply_model(
            model, x, model_state, key, batched=self.batched, layout=self.layout
        )
        if not policy.is_full:
            pred = policy.cast_to_output(pred)
        return pred, new_state

    def one_step(self, state: TrainState, batch: Batch) -> tuple[TrainState, Metrics]:
        """One optimizer step on a `TrainState` (traced; call through `train_step`)."""
        key, sub = jax.random.split(state.key) if self.use_key else (state.key, None)
        scale = state.loss_scale

        def loss_of(model: Any) -> tuple[Array, tuple[Array, Any]]:
            if self.rollout is not None:  # layer state: refused by `Equinox.validate`

                def apply(module: Any, inputs: Array, step_key: Any) -> Array:
                    return self._forward(module, inputs, state.model_state, step_key)[0]

                if self.rollout.rollout.gradient_checkpointing:
                    # each unrolled step's activations are recomputed in the backward pass
                    apply = eqx.filter_checkpoint(apply)
                calls = itertools.count()

                def model_fn(inputs: Array) -> Array:
                    # each unrolled application draws its own dropout masks (as a
                    # framework that draws at every call does); traced in a fixed order
                    step_key = None if sub is None else jax.random.fold_in(sub, next(calls))
                    return apply(model, inputs, step_key)

                loss = self.rollout.train_loss(model_fn, batch, state.step)
                new_mstate = state.model_state
            else:
                pred, new_mstate = self._forward(model, batch["x"], state.model_state, sub)
                loss = self.loss_fn(pred, batch["y"])
            scaled = loss if scale is None else scale.scale_loss(loss)
            return scaled, (loss, new_mstate)

        (_, (loss, mstate)), grads = eqx.filter_value_and_grad(loss_of, has_aux=True)(state.model)
        if mstate is not None:
            mstate = _keep_dtypes(mstate, state.model_state)
        params = eqx.filter(state.model, eqx.is_inexact_array)
        if scale is not None:
            grads = scale.unscale(grads)
        updates, opt_state = self.optimizer.update(grads, state.opt_state, params)
        model = eqx.apply_updates(state.model, updates)
        metrics: Metrics = {"loss": jnp.asarray(loss, jnp.float32)}
        if self.grad_norm:
            metrics[GRAD_NORM] = grad_norm(grads, state.opt_state, accumulate=self.accumulate)
        if scale is not None:
            finite = all_finite(grads)
            model = _select(finite, model, state.model)
            opt_state = _select(finite, opt_state, state.opt_state)
            if mstate is not None:
                mstate = _select(finite, mstate, state.model_state)
            scale = scale.adjust(finite)
        if self.skip_nonfinite:
            ok = jnp.isfinite(metrics["loss"])
            if mstate is not None:
                mstate = _select(ok, mstate, state.model_state)
            if self.accumulate == 1:  # else `_flat_steps` drops the whole update
                model = _select(ok, model, state.model)
                opt_state = _select(ok, opt_state, state.opt_state)
                if scale is not None:
                    scale = _select(ok, scale, state.loss_scale)
        if scale is not None:
            metrics["loss_scale"] = scale.scale
        new = TrainState(model, opt_state, state.step + 1, key, mstate, scale)
        return new, metrics

    def _flat_step(self, leaves: list[Any], batch: Batch) -> tuple[list[Any], Metrics]:
        state, metrics = self.one_step(self.unflatten(leaves), batch)
        return self.flatten(state), metrics

    def _flat_steps(self, leaves: list[Any], stacked: Batch) -> tuple[list[Any], Metrics]:
        m = self.accumulate
        if not (self.skip_nonfinite and m > 1):
            return jax.lax.scan(self._flat_step, leaves, stacked, unroll=scan_unroll())
        # K updates of m batches: an update with a non-finite loss in any batch is dropped
        groups = jax.tree.map(lambda a: a.reshape(a.shape[0] // m, m, *a.shape[1:]), stacked)

        def micro(carry: tuple[list[Any], Array], batch: Batch) -> tuple[Any, Metrics]:
            leaves, ok = carry
            leaves, metrics = self._flat_step(leaves, batch)
            return (leaves, ok & jnp.isfinite(metrics["loss"])), metrics

        def update(leaves: list[Any], group: Batch) -> tuple[list[Any], Metrics]:
            start = self.unflatten(leaves)
            (leaves, ok), metrics = jax.lax.scan(
                micro, (leaves, jnp.asarray(True)), group, unroll=scan_unroll()
            )
            end = self.unflatten(leaves)
            kept = TrainState(
                _select(ok, end.model, start.model),
                _select(ok, end.opt_state, start.opt_state),
                end.step,
                end.key,
                end.model_state,
                end.loss_scale,
            )
            return self.flatten(kept), metrics

        leaves, metrics = jax.lax.scan(update, leaves, groups, unroll=scan_unroll())
        return leaves, jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), metrics)

    # -- evaluation --------------------------------------------------------------------
    def _flat_eval(self, leaves: list[Any], batch: Batch) -> tuple[Array, Array]:
        state = self.unflatten(leaves)
        # validation sees the moving average of the weights when the optimizer keeps one
        model = eqx.nn.inference_mode(ema_model(state.model, state.opt_state))
        if self.rollout is not None and evaluates_as_rollout(batch, self.rollout.rollout):
            # windows: the longest rollout; pairs (`state.predict`, e.g. RolloutMonitor's
            # one-step calls): one model application, below

            def model_fn(inputs: Array) -> Array:
                return self._forward(model, inputs, state.model_state, None)[0]

            pred, loss = self.rollout.eval_loss(model_fn, batch)
            return pred, jnp.asarray(loss, jnp.float32)
        pred, _ = self._forward(model, batch["x"], state.model_state, None)
        return pred, jnp.asarray(self.loss_fn(pred, batch["y"]), jnp.float32)


def scan_unroll() -> int | bool:
    """How `train_steps` unrolls its scan: fully on an accelerator, not at all on the CPU."""
    return True if jax.default_backend() != "cpu" else 1


_CACHE: OrderedDict[tuple[Any, ...], list[StepFunctions]] = OrderedDict()
_CACHE_SIZE = 16


def _same_static(a: Any, b: Any) -> bool:
    try:
        return bool(eqx.tree_equal(a, b))
    except Exception:
        return False


def step_functions(
    template: TrainState, *, optimizer_key: str | None, **kwargs: Any
) -> StepFunctions:
    """`StepFunctions(template, **kwargs)`, reused across runs of the same structure.

    Two runs share compiled steps when their states have the same structure, dtypes,
    shapes and non-array parts, and they use the same loss object, the same optimizer
    config (`optimizer_key`, its JSON; None disables sharing), precision, model
    calling convention and shardings. Sharing saves the compilation (seconds on a
    small CPU) when a process runs many short trainings (sweeps, tests, resumes).
    """
    rollout = kwargs.get("rollout")
    if optimizer_key is None or (rollout is not None and rollout.cache_key() is None):
        return StepFunctions(template, **kwargs)
    shardings = kwargs.get("state_shardings")
    leaves, treedef, static = flatten_state(template)
    key = (
        treedef,
        tuple((x.shape, str(x.dtype)) for x in leaves),
        id(kwargs["loss_fn"]),
        optimizer_key,
        str(kwargs["policy"]),
        kwargs["batched"],
        kwargs.get("layout"),
        kwargs["use_key"],
        kwargs.get("skip_nonfinite", False),
        kwargs.get("accumulate", 1),
        kwargs.get("grad_norm", False),
        None if kwargs.get("rollout") is None else kwargs["rollout"].cache_key(),
        None if shardings is None else tuple(shardings),
        kwargs.get("data_sharding"),
        kwargs.get("stacked_sharding"),
        kwargs.get("replicated"),
    )
    for fns in _CACHE.get(key, []):
        if fns.loss_fn is kwargs["loss_fn"] and _same_static(fns.static, static):
            _CACHE.move_to_end(key)
            return fns
    fns = StepFunctions(template, **kwargs)
    _CACHE.setdefault(key, []).append(fns)
    _CACHE.move_to_end(key)
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return fns
