"""The device rollout of a torch module: the core rollout step in a no-grad loop on tensors.

Each segment of the rollout (`pipekit_train.core.rollout.RolloutPlan`) is a
`torch.inference_mode()` loop of `RolloutSpec.bind(array_api_compat.torch)`'s step
(normalise → model → head mean → de-normalise → residual, or a draw from the predicted
distribution) on the module's device, in eval mode: core's `torch_rollout`, shared with
Keras on torch. The states of a segment stay on the device; at its end one sum over
them (a NaN or inf anywhere makes it non-finite) checks them, the first non-finite step
and member are looked for only then, and the stored states come back to the host in one
copy. Nothing in the loop synchronises with the host.

`RolloutLoss` is rollout training's loss inside a torch update (`Lightning()`'s
`training_step`, `Torch()`'s step): core's `rollout_loss` with the torch namespace, its
length `k = rollout.steps_at(update)` chosen on the host, the input noise the feed
attached to the batch, and `Tensor.detach` as the gradient stop.

**CUDA graphs: not yet.** On a CUDA device each step of the rollout loop launches the model's
and the step's kernels one by one; issue 33 asks for a CUDA-graph capture of the step
loop where `compile=` asks for it (as `Torch(compile="cuda-graphs")` captures the
training update, `torch/_graphs.py`). Not built, because no GPU reaches this project's machines
to test it. What it would take, kept out of the CPU path:

1. A `compile=` keyword through the rollout contract (`NeuralForward.rollout` →
   `model_op.rollout` → core's `torch_rollout`), refused on Equinox and Keras on jax
   (their loop is compiled already) and with `ConfigError` off CUDA
   (`torch.cuda.is_available()` and the module's device).
2. In core's `torch_rollout`: static buffers for the state `(n, *state)` and one
   segment's stored states; the step warmed up a few times on a side stream, then one
   segment of the plan's full length captured with `torch.cuda.graph`, writing into the
   static buffers; per segment: copy the state in, `replay()`, then the same finiteness
   sum and host copy as now. The plan's last, shorter segment runs eagerly.
3. Stochastic rollouts: the seeded `torch.Generator` registered with the graph
   (`CUDAGraph.register_generator_state`), so that each replay draws fresh numbers in
   the same stream; a test that the graphed and eager rollouts of one seed agree.
4. A graphed variant in `benchmarks/bench_rollout.py` (which `scripts/gpu_check.py`
   runs on the GPU) to show whether the eager loop is launch-bound there at all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import array_api_compat
import numpy as np
import torch
import torch.utils.checkpoint

from pipekit_train.core.adapter import (
    FORCING_KEY,
    MEMBER_NOISE_KEY,
    NOISE_KEY,
    Rollout,
    RolloutSpec,
    prepare_rollout,
    rollout_loss,
    rollout_spec_of,
    torch_rollout,
)

__all__ = ["RolloutLoss", "device_rollout"]

#: `TrainState.extra`'s key of the optimizer updates a `Torch()` run has made (the
#: rollout length is a function of it; it is checkpointed with the state).
UPDATES = "rollout_updates"


def device_rollout(
    module: torch.nn.Module,
    state: Any,
    n_steps: int,
    *,
    dtype: torch.dtype,
    device: torch.device,
    spec: RolloutSpec | None = None,
    keep: str | int = "all",
    chunk: int | None = None,
    stochastic: bool = False,
    seed: int = 0,
) -> np.ndarray:
    """Advance a batch of states `n_steps` steps with `module` on `device`.

    Args:
        module: the torch module (run in eval mode; its training mode is restored).
        state: one state or a batch `(n, *state)` (numpy or a tensor).
        n_steps: the number of steps.
        dtype: the module's floating dtype (the states' dtype on the device).
        device: the module's device.
        spec: the step's normalizer, residual and head (None: `next = module(state)`).
        keep: `"all"`, an int `k` or `"last"` (see `RolloutPlan`).
        chunk: the most steps per segment (None: bounded by memory).
        stochastic: draw each step from the predicted distribution.
        seed: the seed of the `torch.Generator` of the draws.

    Returns:
        The stored states (numpy), `(len(kept), n, *state)` (no `n` axis for one state).
    """
    if isinstance(state, torch.Tensor):
        state = state.detach().float().cpu().numpy()
    itemsize = torch.empty((), dtype=dtype).element_size()
    spec, x0, single, plan = prepare_rollout(
        state, n_steps, spec, keep, chunk, itemsize=itemsize, stochastic=stochastic, seed=seed
    )
    was_training = module.training
    module.eval()
    try:
        return torch_rollout(
            torch,
            module,
            spec,
            x0,
            plan,
            dtype=dtype,
            device=device,
            single=single,
            stochastic=stochastic,
            seed=seed,
        )
    finally:
        module.train(was_training)


def _detach(t: Any) -> Any:
    return t.detach()


class RolloutLoss:
    """The rollout-training loss of a torch update: core's `rollout_loss` on tensors.

    The unrolled steps are a Python loop recorded by autograd, so activation memory
    grows linearly with `k` (`backprop="last"` keeps one step's graph). With
    `Rollout(gradient_checkpointing=True)` each step's model application runs under
    `torch.utils.checkpoint` (non-reentrant, the RNG state preserved): only its input
    is kept, and its activations are recomputed in the backward pass.

    Args:
        rollout: the `Rollout` spec.
        normalizer: the run's normalizer (or None).
        loss_fn: the plan's loss on tensors (`"mse"`).
        state_ndim: the axes of one state.
    """

    def __init__(
        self,
        rollout: Rollout,
        normalizer: Any,
        loss_fn: Callable[[Any, Any], Any],
        *,
        state_ndim: int = 1,
        inputs: Any = None,
    ):
        self.rollout = rollout
        self.spec = rollout_spec_of(rollout, normalizer, state_ndim, inputs, loss_fn)
        self.loss_fn = loss_fn
        # Made once and reused by every update (torch runs the loss eagerly, so building
        # them per update was per-step host work): the statistics as tensors per (dtype,
        # device), and the bound step per (state shape, dtype, device). The same values
        # as building them afresh, so the loss is unchanged to the bit.
        self._constants: dict[tuple[Any, Any], Callable[[np.ndarray], Any]] = {}
        self._steps: dict[tuple[Any, ...], Callable[..., Any]] = {}

    @classmethod
    def of(cls, plan: Any, loss_fn: Callable[[Any, Any], Any]) -> RolloutLoss | None:
        """The loss of a plan with `rollout` (None without one)."""
        if plan.rollout is None:
            return None
        trajectories = getattr(plan.data, "trajectories", None)  # TrajectoryWindows (checked)
        ndim = len(trajectories.state_shape) if trajectories is not None else 1
        return cls(plan.rollout, plan.normalizer, loss_fn, state_ndim=ndim, inputs=plan.inputs)

    def predict(
        self, model_fn: Callable[[Any], Any], batch: Mapping[str, Any], k: int, noise: Any = None
    ) -> tuple[Any, Any]:
        """`(loss, predicted targets (B, k, ...))` of a `k`-step rollout of `batch`
        (compared with the trajectory: validation's)."""
        return self._loss(model_fn, batch, k, noise, predictions=True)

    def _constant(self, dtype: torch.dtype, device: torch.device) -> Callable[[np.ndarray], Any]:
        """float64 numpy constant → a tensor of `dtype` on `device`, memoised per array.

        The arrays are the spec's cached statistics (the same objects every update); a
        memo entry keeps its array alive, so its `id` is not reused while it is cached.
        """
        key = (dtype, device)
        fn = self._constants.get(key)
        if fn is not None:
            return fn
        memo: dict[int, tuple[np.ndarray, Any]] = {}

        def constant(a: np.ndarray) -> Any:
            hit = memo.get(id(a))
            if hit is not None and hit[0] is a:
                return hit[1]
            t = torch.tensor(np.array(a), device=device).to(dtype)
            if len(memo) >= 64:  # only ever a handful; never grow without bound
                memo.clear()
            memo[id(a)] = (a, t)
            return t

        self._constants[key] = constant
        return constant

    def _loss(
        self,
        model_fn: Callable[[Any], Any],
        batch: Mapping[str, Any],
        k: int,
        noise: Any,
        *,
        predictions: bool,
        training: bool = False,
    ) -> tuple[Any, Any]:
        x = batch["x"]
        xp = array_api_compat.array_namespace(x)
        constant = self._constant(x.dtype, x.device)
        shape = self.spec.state_shape(tuple(x.shape[1:]))
        key = (shape, x.dtype, x.device)
        step = self._steps.get(key)
        if step is None:
            step = self.spec.bind(xp, state_shape=shape, out_shape=shape, constant=constant)
            self._steps[key] = step
        dtype = x.dtype
        return rollout_loss(
            xp,
            spec=self.spec,
            model_fn=lambda state: model_fn(state).to(dtype),
            x=x,
            y=batch["y"],
            weights=self.rollout.step_weights(k),
            backprop=self.rollout.backprop,
            loss_fn=self.loss_fn,
            detach=_detach,
            noise=noise,
            constant=constant,
            step=step,
            predictions=predictions,
            forcing=batch.get(FORCING_KEY),
            reference=self.rollout.ref_stepper if training else None,
            cut_div_chain=self.rollout.cut_div_chain,
            reduction=self.rollout.reduction if training else "mean",
            member_noise=batch.get(MEMBER_NOISE_KEY),
        )

    def train_loss(
        self, model_fn: Callable[[Any], Any], batch: Mapping[str, Any], update: int
    ) -> Any:
        """The loss of a batch of optimizer update `update` (0-based) with its noise."""
        k = self.rollout.steps_at(int(update))
        if self.rollout.gradient_checkpointing and torch.is_grad_enabled():
            inner = model_fn

            def model_fn(state: Any) -> Any:
                return torch.utils.checkpoint.checkpoint(inner, state, use_reentrant=False)

        # only the loss: the predicted targets (validation's) are not built per update
        return self._loss(
            model_fn, batch, k, batch.get(NOISE_KEY), predictions=False, training=True
        )[0]

    def eval_loss(
        self, model_fn: Callable[[Any], Any], batch: Mapping[str, Any]
    ) -> tuple[Any, Any]:
        """`(predicted targets, loss)` of the longest rollout, without noise."""
        loss, pred = self.predict(model_fn, batch, self.rollout.max_steps)
        return pred, loss
