"""The rollout of a `keras.Model` on the Keras backend's own arrays: the device rollout
(`device_rollout`) and rollout training (`RolloutLoss`).

The device rollout (`KerasModelOp.rollout`):

- jax backend: each segment of the rollout is one jitted `lax.fori_loop` over the core
  rollout step (`RolloutSpec.bind(jax.numpy)`) around `model.stateless_call(...,
  training=False)`: core's `jax_rollout`, the loop the Equinox rollout runs.
- torch backend: a `torch.inference_mode()` loop of the same step
  (`array_api_compat.torch`) calling the model on tensors on its device: core's
  `torch_rollout`, the loop the Lightning rollout runs.

The plan (segments, `keep`, `chunk`) and the step are core's
(`pipekit_train.core.rollout`), the same as the other backends'.

Rollout training (`TrainingLoop(rollout=Rollout(...))`), `RolloutLoss`: core's rollout loss
inside Keras's own step.

`install_rollout` changes two things on the compiled training model, the way `_skip`
wraps its step, and leaves the rest of Keras's train step (jax and torch alike) as it
is, so gradient accumulation, loss scaling, clipping, the moving average and the
non-finite policies keep their meaning:

- `model.compute_loss` becomes core's `rollout_loss` (`pipekit_train.core.rollout`):
  the model is called `k` times on the backend's arrays (`array_api_compat`'s namespace
  of the batch: `jax.numpy` or torch), each step exactly `NeuralForward`'s inference
  step, with the backend's gradient stop (`jax.lax.stop_gradient`, `Tensor.detach`) for
  pushforward and cut backpropagation, and the input noise core's feed drew
  (`batch["noise"]`, carried in `y`). Keras's own forward pass of `x` is not used (on
  jax XLA drops it; on torch it is one extra forward without backward). The model's
  added losses (regularizers) are added, as Keras adds them to its compiled loss.
- the rollout length of each batch, `rollout.steps_at(update)`, is chosen on the host
  from the run's optimizer updates (`RolloutLoss.start`, then one count per batch:
  `update = batches // accumulate`, skipped updates included, as Equinox's step counter
  and `Torch()`'s update count do). On jax the train function holds one jitted step per
  length of the schedule and calls the one of each batch (Keras's fused executions are a
  Python loop over that per-batch call, so each batch gets its own); on torch the wrapped
  `train_step` notes the length before Keras's eager step. A `lax.switch` over the
  lengths inside one jitted step cost 11x the fixed-length step on the CPU for a conv
  net (`benchmarks/bench_rollout_schedule.py`).
- `Rollout(gradient_checkpointing=True)` recomputes each model application in the
  backward pass (`jax.checkpoint` / `torch.utils.checkpoint`), so an update keeps one
  state per step instead of the model's activations.

Validation (`eval_rollout`) rolls the longest rollout out without noise on the host,
one `predict_on_batch` per step, and returns the predicted targets `(B, k, ...)` and the
rollout loss, like Equinox's `eval_loss`.

Nothing here imports keras at import time (the package's import does not).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from pipekit_train.core.adapter import (
    FORCING_KEY,
    MEMBER_NOISE_KEY,
    NOISE_KEY,
    ConfigError,
    Rollout,
    RolloutSpec,
    jax_rollout,
    prepare_rollout,
    rollout_loss,
    rollout_spec,
    rollout_spec_of,
    torch_rollout,
)

__all__ = [
    "RolloutLoss",
    "check_rollout_model",
    "device_rollout",
    "install_rollout",
    "rollout_inputs",
    "rollout_targets",
    "stepper_shape",
]

TARGET_KEY = "y"


def device_rollout(
    model: Any,
    state: Any,
    n_steps: int,
    *,
    cache: dict,
    spec: RolloutSpec | None = None,
    keep: str | int = "all",
    chunk: int | None = None,
    stochastic: bool = False,
    seed: int = 0,
) -> np.ndarray:
    """Advance a batch of states `n_steps` steps with `model` on the backend's device.

    Args:
        model: the built `keras.Model` (called with `training=False`).
        state: one state or a batch `(n, *state)`.
        n_steps: the number of steps.
        cache: where the jax backend keeps its compiled segments.
        spec: the step's normalizer, residual and head (None: `next = model(state)`).
        keep: `"all"`, an int `k` or `"last"` (see `RolloutPlan`).
        chunk: the most steps per segment (None: bounded by memory).
        stochastic: draw each step from the predicted distribution.
        seed: the seed of the draws.

    Returns:
        The stored states (numpy), `(len(kept), n, *state)` (no `n` axis for one state).
    """
    import keras

    dtype = keras.backend.standardize_dtype(model.compute_dtype)
    itemsize = np.dtype(dtype).itemsize if dtype != "bfloat16" else 2
    spec, x0, single, plan = prepare_rollout(
        state, n_steps, spec, keep, chunk, itemsize=itemsize, stochastic=stochastic, seed=seed
    )
    options: dict[str, Any] = {"single": single, "stochastic": stochastic, "seed": seed}
    if keras.backend.backend() == "jax":
        import jax

        params = (
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
        )

        def model_fn(params: Any) -> Any:
            return lambda x: model.stateless_call(params[0], params[1], x, training=False)[0]

        return jax_rollout(
            jax,
            model_fn,
            params,
            spec,
            x0,
            plan,
            dtype=dtype,
            cache=cache,
            cache_key=id(model),
            **options,
        )
    import torch

    weights = model.weights
    device = weights[0].value.device if weights else torch.device("cpu")
    return torch_rollout(
        torch,
        lambda x: model(x, training=False),
        spec,
        x0,
        plan,
        dtype=getattr(torch, dtype),
        device=device,
        **options,
    )


def check_rollout_model(model: Any, rollout: Rollout) -> None:
    """Refuse a model with layer state (BatchNorm statistics, dropout seed states).

    Raises:
        ConfigError: the model has non-trainable variables.
    """
    state = [getattr(v, "path", getattr(v, "name", "?")) for v in model.non_trainable_variables]
    if state:
        raise ConfigError(
            "Rollout training on Keras does not carry layer state (BatchNorm statistics, "
            "dropout seed states) through the unrolled steps. Received: a model with "
            f"non-trainable variables {state[:3]} and rollout=Rollout(steps={rollout.steps}). "
            "Use a model without such layers, or drop `rollout`."
        )


def rollout_inputs(batch: Mapping[str, Any]) -> Any:
    """The `x` that `model.fit` gets for a rollout batch: the states, with zero noise
    channels appended for a generative model (the batch carries `"member_noise"`).

    Keras's train step applies the model to `x` before the loss (whose rollout ignores
    that output), so `x` must be a valid model input; `RolloutLoss.compute_loss` drops the
    channels again and takes the members' noise from `y`.
    """
    x = batch["x"]
    if MEMBER_NOISE_KEY not in batch:
        return x
    w = int(np.shape(batch[MEMBER_NOISE_KEY])[-1])
    return np.concatenate([x, np.zeros((*np.shape(x)[:-1], w), np.asarray(x).dtype)], axis=-1)


def rollout_targets(batch: Mapping[str, Any]) -> Any:
    """The `y` that `model.fit` gets for a rollout batch: the targets, with the noise.

    Without noise or forcings the targets themselves; with `batch["noise"]` or each
    step's forcings (`batch["forcing"]`) a dict `{"y": targets, "noise": noise,
    "forcing": ...}` (Keras passes `y` through to `compute_loss` only).
    """
    extras = [key for key in (NOISE_KEY, FORCING_KEY, MEMBER_NOISE_KEY) if key in batch]
    if not extras:
        return batch[TARGET_KEY]
    return {TARGET_KEY: batch[TARGET_KEY], **{key: batch[key] for key in extras}}


class RolloutLoss:
    """Core's rollout loss on one compiled Keras model (see the module).

    Args:
        model: the compiled training model.
        rollout: the `Rollout` spec.
        normalizer: the run's normalizer (or None).
        loss_fn: core's loss (`"mse"`).
        accumulate: batches per optimizer update.
        state_ndim: the axes of one state.
        inputs: the model input's layout (`plan.inputs`), None for the state alone.
    """

    def __init__(
        self,
        model: Any,
        rollout: Rollout,
        normalizer: Any,
        loss_fn: Callable[[Any, Any], Any],
        *,
        accumulate: int = 1,
        state_ndim: int = 1,
        inputs: Any = None,
    ):
        self.model = model
        self.rollout = rollout
        self.spec = rollout_spec_of(rollout, normalizer, state_ndim, inputs, loss_fn)
        # validation rolls out on the host: the coarse stepper (in the backend's arrays)
        # gets numpy arrays through the backend's tensors
        self.host_spec = self.spec
        if rollout.coarse_stepper is not None:
            self.host_spec = rollout_spec(
                normalizer,
                rollout.residual,
                state_ndim,
                inputs,
                coarse_stepper=_on_host(rollout.coarse_stepper),
                correction=rollout.correction,
            )
        self.loss_fn = loss_fn
        self.accumulate = int(accumulate)
        self.stages = rollout.stages()
        import keras

        self.jax = keras.backend.backend() == "jax"
        self.k: int | None = None  # the rollout length of the step being computed (or traced)
        self.batches: int | None = None  # batches trained so far (`start`, `next_length`)

    # -- one rollout ---------------------------------------------------------------------
    def predict(
        self,
        model_fn: Callable[[Any], Any],
        x: Any,
        y: Any,
        k: int,
        noise: Any = None,
        forcing: Any = None,
        training: bool = False,
        member_noise: Any = None,
    ) -> tuple[Any, Any]:
        """`(loss, predicted targets (B, k, ...))` of a `k`-step rollout on device arrays
        (`training=True`: a diverted chain compares with the reference stepper)."""
        import array_api_compat

        import keras

        xp = array_api_compat.array_namespace(x)
        call = self._checkpointed(model_fn) if self.rollout.gradient_checkpointing else model_fn
        if self.jax:
            import jax

            def detach(a: Any) -> Any:
                return jax.lax.stop_gradient(a)

            def constant(a: np.ndarray) -> Any:
                return xp.asarray(a, dtype=x.dtype)

        else:

            def detach(a: Any) -> Any:
                return a.detach()

            def constant(a: np.ndarray) -> Any:
                return xp.asarray(a, dtype=x.dtype, device=x.device)

        return rollout_loss(
            xp,
            spec=self.spec,
            model_fn=lambda s: keras.ops.cast(call(s), x.dtype),
            x=x,
            y=y,
            weights=self.rollout.step_weights(k),
            backprop=self.rollout.backprop,
            loss_fn=self.loss_fn,
            detach=detach,
            noise=noise,
            constant=constant,
            forcing=forcing,
            reference=self.rollout.ref_stepper if training else None,
            cut_div_chain=self.rollout.cut_div_chain,
            reduction=self.rollout.reduction if training else "mean",
            member_noise=member_noise,
        )

    def _checkpointed(self, model_fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """`model_fn` recomputed in the backward pass (`Rollout(gradient_checkpointing=True)`):
        `jax.checkpoint` on jax, `torch.utils.checkpoint` on torch."""
        if self.jax:
            import jax

            return jax.checkpoint(model_fn)
        from torch.utils.checkpoint import checkpoint

        return lambda s: checkpoint(model_fn, s, use_reentrant=False)

    # -- the schedule's clock -------------------------------------------------------------
    def start(self, updates: int) -> None:
        """Before Keras's first train step: the optimizer updates the run has completed
        (restored from a checkpoint or 0); each batch after it counts one."""
        self.batches = int(updates) * self.accumulate

    def next_length(self) -> int:
        """The rollout length of the next batch trained (and count that batch)."""
        if self.batches is None:
            raise RuntimeError("RolloutLoss.start() was not called before the first step")
        k = self.rollout.steps_at(self.batches // self.accumulate)
        self.batches += 1
        return k

    # -- Keras's hooks -------------------------------------------------------------------
    def compute_loss(
        self,
        x: Any = None,
        y: Any = None,
        y_pred: Any = None,
        sample_weight: Any = None,
        training: bool = True,
    ) -> Any:
        """`Model.compute_loss`: the rollout loss of the batch (`y_pred` is not used)."""
        import keras

        target, noise, forcing, members = (
            (y[TARGET_KEY], y.get(NOISE_KEY), y.get(FORCING_KEY), y.get(MEMBER_NOISE_KEY))
            if isinstance(y, Mapping)
            else (y, None, None, None)
        )
        if members is not None:  # `rollout_inputs` appended zero noise channels for Keras
            x = x[..., : x.shape[-1] - int(members.shape[-1])]
        model = self.model

        def model_fn(s: Any) -> Any:
            return model(s, training=training)

        if not training:  # evaluation: the longest, without noise
            k = self.rollout.max_steps
        elif self.k is None:
            raise RuntimeError("the rollout loss was computed outside the wrapped train step")
        else:
            k = self.k
        loss = self.predict(
            model_fn,
            x,
            target,
            k,
            noise if training else None,
            forcing,
            training=training,
            member_noise=members,
        )[0]
        for extra in model.losses:  # regularizers, as Keras adds them to its loss
            loss = loss + keras.ops.cast(keras.ops.sum(extra), loss.dtype)
        return loss

    def _at_length(self, step: Callable[..., Any], k: int) -> Callable[..., Any]:
        """`step` (Keras's train step, or `_skip`'s) computing a `k`-step rollout."""

        def train_step(*args: Any) -> Any:
            self.k = k  # read by `compute_loss` (on jax: while the step is traced)
            try:
                return step(*args)
            finally:
                self.k = None

        return train_step

    def wrap_train_step(self) -> None:
        """Give each train step its batch's rollout length (see the module)."""
        import keras

        model = self.model
        step = model.train_step  # Keras's own (or `_skip`'s), bound
        if not self.jax:
            by_length = {k: self._at_length(step, k) for _, k in self.stages}

            def eager_step(data: Any) -> Any:
                return by_length[self.next_length()](data)

            object.__setattr__(model, "train_step", eager_step)
            return
        import jax

        def make_train_function(force: bool = False) -> Any:
            if model.train_function is not None and not force:
                return None
            compiled = not model.run_eagerly and model.jit_compile
            options: dict[str, Any] = {"donate_argnums": 0}
            if keras.distribution.distribution() is not None:
                options["out_shardings"] = (None, model._get_state_sharding_spec())
            by_length = {}
            for _, k in self.stages:
                fn = self._at_length(step, k)
                by_length[k] = jax.jit(fn, **options) if compiled else fn

            def train_step(state: Any, data: Any) -> Any:
                return by_length[self.next_length()](state, data)

            model.train_function = model._make_function(train_step)
            return None

        object.__setattr__(model, "make_train_function", make_train_function)

    # -- validation ----------------------------------------------------------------------
    def eval_rollout(
        self, predict: Callable[[np.ndarray], np.ndarray], batch: Mapping[str, np.ndarray]
    ) -> tuple[np.ndarray, float]:
        """`(predicted targets (B, k, ...), loss)` of the longest rollout, without noise, on
        the host (`predict`: the model on a numpy batch)."""
        x = np.asarray(batch["x"])
        loss, pred = rollout_loss(
            np,
            spec=self.host_spec,
            model_fn=lambda s: np.asarray(predict(np.asarray(s, x.dtype)), x.dtype),
            x=x,
            y=np.asarray(batch["y"]),
            weights=self.rollout.step_weights(self.rollout.max_steps),
            backprop=self.rollout.backprop,
            loss_fn=self.loss_fn,
            constant=lambda a: np.asarray(a, x.dtype),
            forcing=None if FORCING_KEY not in batch else np.asarray(batch[FORCING_KEY]),
            member_noise=(
                None if MEMBER_NOISE_KEY not in batch else np.asarray(batch[MEMBER_NOISE_KEY])
            ),
        )
        return np.asarray(pred), float(loss)


def _on_host(stepper: Callable[[Any], Any]) -> Callable[[np.ndarray], np.ndarray]:
    """`stepper` (on the backend's arrays) called with numpy arrays and returning numpy."""
    import keras

    def host(x: np.ndarray) -> np.ndarray:
        out = stepper(keras.ops.convert_to_tensor(x))
        return np.asarray(keras.ops.convert_to_numpy(out), dtype=x.dtype)

    return host


def stepper_shape(
    stepper: Callable[[Any], Any], state_shape: tuple[int, ...], dtype: Any = "float32"
) -> tuple[int, ...] | None:
    """The output shape of a rollout's stepper on a batch of the backend's zero states
    (jax: `jax.eval_shape`, abstract; torch: one call without autograd)."""
    import keras

    kind = np.dtype(dtype).name
    if keras.backend.backend() == "jax":
        import jax

        probe = jax.ShapeDtypeStruct(tuple(state_shape), jax.dtypes.canonicalize_dtype(kind))
        shape = getattr(jax.eval_shape(stepper, probe), "shape", None)
    else:
        import torch

        with torch.no_grad():
            out = stepper(keras.ops.zeros(tuple(state_shape), dtype=kind))
        shape = getattr(out, "shape", None)
    return None if shape is None else tuple(int(d) for d in shape)


def install_rollout(model: Any, plan: Any) -> RolloutLoss:
    """Make the compiled `model` minimise `plan.rollout`'s loss (see the module); return it."""
    rollout = plan.rollout
    trajectories = getattr(plan.data, "trajectories", None)  # TrajectoryWindows (checked)
    ndim = len(trajectories.state_shape) if trajectories is not None else 1
    training = RolloutLoss(
        model,
        rollout,
        plan.normalizer,
        plan.loss,
        accumulate=plan.accumulate_grad_batches,
        state_ndim=ndim,
        inputs=plan.inputs,
    )
    object.__setattr__(model, "compute_loss", training.compute_loss)
    training.wrap_train_step()
    return training
