"""The rollout-training loss, written once against the Python array API.

`rollout_loss` is what one optimizer update of `TrainingLoop(rollout=Rollout(...))`
minimises (the semantics are documented on `pipekit_train.core.Rollout`). A backend
calls it inside its own differentiated step with its array namespace (`jax.numpy`,
torch), its gradient stop (`jax.lax.stop_gradient`, `Tensor.detach`) and its model
call; with `xp=numpy` and no gradient stop it is the host reference. Nothing here
imports a backend.

The batch arrives as the run's feed delivers it: normalised by the run's normalizer
(`"x"` with the state statistics, `"y"` with the target statistics) or raw without one.
The statistics are applied outside the loop: `x_0` and the targets are turned back into
physical states once, each step is `RolloutSpec`'s inference step (normalise → model →
de-normalise → residual) on physical states, and each loss compares predicted and true
states in normalised units of the state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.losses._ensemble import ENSEMBLE_LOSSES, ensemble_params

from ._noise import MEMBER_NOISE_KEY
from ._step import RolloutSpec

__all__ = ["check_rollout_loss", "evaluates_as_rollout", "rollout_loss", "rollout_spec"]


def rollout_spec(
    normalizer: Any,
    residual: bool,
    state_ndim: int,
    inputs: Any = None,
    *,
    coarse_stepper: Callable[[Any], Any] | None = None,
    correction: str | None = None,
    noise_dim: int | None = None,
) -> RolloutSpec:
    """The `RolloutSpec` a rollout-trained model is rolled out with (`NeuralForward`'s);
    `inputs` is the run's `ModelInputs` (`plan.inputs`), None for the state alone;
    `coarse_stepper` and `correction` the `Rollout`'s (a model that corrects a solver);
    `noise_dim` the noise channels of a generative model (an ensemble loss), else None."""
    return RolloutSpec(
        normalizer=normalizer,
        residual=residual,
        state_ndim=state_ndim,
        inputs=inputs,
        coarse_stepper=coarse_stepper,
        correction=correction,
        head="point" if noise_dim is None else "generative",
        head_options=None if noise_dim is None else {"noise_dim": int(noise_dim)},
    )


def rollout_spec_of(
    rollout: Any, normalizer: Any, state_ndim: int, inputs: Any = None, loss: Any = None
) -> RolloutSpec:
    """The `RolloutSpec` of a run trained with `rollout` (a `Rollout`): its residual flag,
    coarse stepper and correction, the run's normalizer, state rank and `ModelInputs`
    (`plan.inputs`), and the generative head an ensemble `loss` (a `Loss`) implies. The
    one place every backend's rollout loss gets its spec from."""
    describe = getattr(loss, "describe", None)
    ensemble = ensemble_params(describe()) if callable(describe) else None
    return rollout_spec(
        normalizer,
        rollout.residual,
        state_ndim,
        inputs,
        coarse_stepper=rollout.coarse_stepper,
        correction=rollout.correction,
        noise_dim=None if ensemble is None else ensemble[1],
    )


def evaluates_as_rollout(batch: Any, rollout: Any) -> bool:
    """Whether a rollout-trained run's evaluator rolls `batch` out (or applies the model once).

    Windows (targets `(B, K, *state)`: one axis more than `x`) are evaluated as the
    longest rollout, as validation does; pairs (`(B, *state)` targets: the one-step calls
    of `state.predict`, e.g. `RolloutMonitor`'s) as one model application. With a
    rollout of length 1 the two are the same, and pairs go through the rollout too. A
    batch with member noise (a generative model's) goes through the rollout always
    (one step for pairs).

    Args:
        batch: the batch's arrays (anything with `ndim`) under `"x"` and `"y"`.
        rollout: the run's `Rollout`.
    """
    windows = batch["y"].ndim == batch["x"].ndim + 1
    # a generative model's batch (its members' noise given) is always the rollout's: its
    # loss makes the members, one step for pairs
    return bool(windows or rollout.max_steps == 1 or MEMBER_NOISE_KEY in batch)


def check_rollout_loss(loss: Any) -> None:
    """Refuse a loss the rollout training does not define yet: it takes `"mse"`, and the
    ensemble losses `"crps"` and `"energy_score"` (a generative model, with `noise_dim`).

    Raises:
        ConfigError: another loss, or an ensemble loss without `noise_dim`.
    """
    name = getattr(loss, "name", None)
    if name in ENSEMBLE_LOSSES:
        ensemble_params(loss.describe())
        return
    if name != "mse":
        label = name or getattr(loss, "__name__", repr(loss))
        raise ConfigError(
            "Rollout training compares predicted and true states with the mean squared "
            f"error, or scores an ensemble (crps, energy_score). Received: loss={label!r} "
            "with rollout=Rollout(...). Use loss='mse' (or an ensemble loss), or drop "
            "`rollout`."
        )


def _identity(a: Any) -> Any:
    return a


def _units(
    to: Callable[[np.ndarray], Any], affine: Any, channels: slice | None = None
) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """`(to physical units, to normalised units)` of an `AffineMap` (on `channels` of its
    last axis), identities without one."""
    if affine is None:
        return _identity, _identity
    mean, std = affine.mean, affine.std
    if channels is not None:
        mean, std = mean[..., channels], std[..., channels]
    m, s = to(mean), to(std)

    def physical(a: Any) -> Any:
        return a * s + m

    def normalised(a: Any) -> Any:
        return (a - m) / s

    return physical, normalised


def _reduce(total: Any, weights: Sequence[float], reduction: str) -> Any:
    """The update's loss from the weighted sum of its per-step losses (`Rollout.reduction`)."""
    return total if reduction == "sum" else total / float(sum(weights))


def rollout_loss(
    xp: Any,
    *,
    spec: RolloutSpec,
    model_fn: Callable[[Any], Any],
    x: Any,
    y: Any,
    weights: Sequence[float],
    backprop: str | int,
    loss_fn: Callable[[Any, Any], Any],
    detach: Callable[[Any], Any] = lambda a: a,
    noise: Any = None,
    constant: Callable[[np.ndarray], Any] | None = None,
    step: Callable[..., Any] | None = None,
    predictions: bool = True,
    forcing: Any = None,
    reference: Callable[[Any], Any] | None = None,
    cut_div_chain: bool = False,
    reduction: str = "mean",
    member_noise: Any = None,
) -> tuple[Any, Any]:
    """The weighted `k`-step rollout loss of one batch, and the predicted targets.

    Args:
        xp: the array namespace of `x` and `y`.
        spec: the inference step (`rollout_spec(normalizer, residual, state_ndim)`).
        model_fn: the model on a batch of normalised states (its raw output).
        x: the first states `(B, *state)`, as the feed delivers them (normalised).
        y: the targets `(B, K, *state)` with `K >= k` (or `(B, *state)` for `K = 1`):
            normalised increments when `spec.residual`, else normalised states.
        weights: the `k` per-step loss weights; `k = len(weights)`.
        backprop: `"full"`, `"last"` or an int `m` (see `Rollout`).
        loss_fn: `loss(pred, target)` (core's `"mse"`).
        detach: the backend's gradient stop.
        noise: Gaussian noise of `x`'s shape in normalised units of the state (already
            scaled by `noise_std`), added to `x_0`; None: none.
        constant: float64 numpy constant → an array of `x`'s library, dtype and device.
        step: `spec.bind(xp, state_shape=..., out_shape=..., constant=constant)` bound
            already (an eager backend binds it once per shape instead of every update);
            None: bound here.
        predictions: also build the predicted targets; False (a training step that only
            needs the loss) skips their per-step arithmetic and returns None for them. The
            loss is the same either way: the predictions are not part of it.
        forcing: with a `spec.inputs` layout that has forcings, each step's forcings in
            raw units, `(B, K, *spatial, F)` (the windows' `"forcing"`); None otherwise.
        reference: the diverted chain's reference stepper (`Rollout(target="diverted")`),
            on physical states of `xp`: step `i`'s prediction is compared with
            `reference(previous state)` (the model's state before the step, after any
            gradient stop of `backprop`) instead of the targets `y`. None: the targets.
        cut_div_chain: `detach` the reference's output (no gradient through it).
        reduction: `"mean"` (the weighted mean of the per-step losses) or `"sum"` (their
            weighted sum; `Rollout.reduction`: backends pass it for training only).
        member_noise: with a generative head (`spec.head == "generative"`, a loss such as
            `crps(members=M, noise_dim=w)`), the members' noise `(B, M, k', *spatial, w)`
            with `k' >= k` (the batch's `"member_noise"`, drawn by core's feed). Required
            for that head; None otherwise.

    With `spec.coarse_stepper` each step is the corrected step (`RolloutSpec.bind`).

    **Ensembles.** With a generative head every sample's first state is repeated for the
    `M` members of `member_noise`; member `m` is rolled out through the `k` steps with
    its own noise (step `i` takes `member_noise[:, m, i]`), and each step's loss scores
    the `M` predictions together against the truth (`loss_fn(pred (B, M, *state),
    target (B, *state))`, e.g. the CRPS). With `M = 1` (one member per sample, e.g. a
    prediction for chosen noise) the step's loss is the mean absolute error, the CRPS of
    one member. The predicted targets are the ensemble mean's.

    With a `spec.inputs` layout `x` is the model's whole first input (history, forcings,
    static inputs; `ModelInputs`), normalised as one array; each step's input is the
    previous one advanced by `ModelInputs.advance` (the new state appended to the
    history, that step's forcings), and the noise perturbs the state channels only.

    Returns:
        `(loss, predicted targets)`: the weighted mean (or sum) of the per-step losses, and the
        predictions in `y`'s representation and units, `(B, k, *state)` (None with
        `predictions=False`).
    """
    if reduction not in ("mean", "sum"):
        raise ConfigError(
            f"`reduction` must be 'mean' or 'sum'. Received: reduction={reduction!r}. "
            "Use Rollout(reduction=...)'s value."
        )
    to = constant or xp.asarray
    k = len(weights)
    if spec.head == "generative":
        if reference is not None:
            raise ConfigError(
                "The diverted chain compares each member with the reference stepper of its "
                "own state, which is not one truth per sample for an ensemble score. "
                "Received: a reference stepper with a generative model (an ensemble loss). "
                "Use Rollout(target='trajectory') for ensemble training."
            )
        return _ensemble_rollout_loss(
            xp,
            spec=spec,
            model_fn=model_fn,
            x=x,
            y=y,
            weights=weights,
            backprop=backprop,
            loss_fn=loss_fn,
            detach=detach,
            noise=noise,
            member_noise=member_noise,
            to=to,
            predictions=predictions,
            reduction=reduction,
        )
    if spec.inputs is not None:
        if reference is not None:
            raise ConfigError(
                "The diverted chain's reference stepper advances the state alone, so it "
                "does not serve a model that sees history, forcings or static inputs yet. "
                "Received: a reference stepper with inputs=ModelInputs(...). Use "
                "Rollout(target='trajectory') for such a model."
            )
        return _rollout_loss_with_inputs(
            xp,
            spec=spec,
            model_fn=model_fn,
            x=x,
            y=y,
            weights=weights,
            backprop=backprop,
            loss_fn=loss_fn,
            detach=detach,
            noise=noise,
            to=to,
            step=step,
            predictions=predictions,
            forcing=forcing,
            reduction=reduction,
        )
    state_shape = tuple(x.shape[1:])
    if y.ndim == x.ndim:
        y = xp.expand_dims(y, axis=1)
    if step is None:
        step = spec.bind(xp, state_shape=state_shape, out_shape=state_shape, constant=to)
    x_map, y_map = spec.maps(state_shape, state_shape)
    phys_x, norm_x = _units(to, x_map)
    phys_y, norm_y = _units(to, y_map)

    clean = phys_x(x)
    state = clean if noise is None else phys_x(x + noise)
    truth, previous = clean, state
    total: Any = 0.0
    predicted = []
    for i in range(k):
        if reference is None:
            target = phys_y(y[:, i, ...])
            truth = truth + target if spec.residual else target
        else:  # the diverted chain: the reference stepper from the model's state
            truth = reference(state)
            if cut_div_chain:
                truth = detach(truth)
        nxt = step(model_fn, state)
        if backprop == "last" and i < k - 1:
            nxt = detach(nxt)
        term = loss_fn(norm_x(nxt), norm_x(truth))
        weight = float(weights[i])
        # `1.0 * term` is `term` exactly, so for the default unit weights the multiply (and
        # its backward: an eager op each) is skipped; the `0.0 + ...` above still gives
        # `total` the same dtype as before on every namespace
        total = total + (term if weight == 1.0 else weight * term)
        if predictions:
            predicted.append(norm_y(nxt - previous) if spec.residual else norm_y(nxt))
        previous = state = nxt
        if not isinstance(backprop, str) and (i + 1) % int(backprop) == 0 and i < k - 1:
            state = detach(state)
    loss = _reduce(total, weights, reduction)
    return loss, (xp.stack(predicted, axis=1) if predictions else None)


def _rollout_loss_with_inputs(
    xp: Any,
    *,
    spec: RolloutSpec,
    model_fn: Callable[[Any], Any],
    x: Any,
    y: Any,
    weights: Sequence[float],
    backprop: str | int,
    loss_fn: Callable[[Any, Any], Any],
    detach: Callable[[Any], Any],
    noise: Any,
    to: Callable[[np.ndarray], Any],
    step: Callable[..., Any] | None,
    predictions: bool,
    forcing: Any,
    reduction: str = "mean",
) -> tuple[Any, Any]:
    """`rollout_loss` for a model with a `ModelInputs` layout (see there)."""
    inputs = spec.inputs
    k = len(weights)
    state_shape = tuple(inputs.state_shape)
    if y.ndim == x.ndim:
        y = xp.expand_dims(y, axis=1)
    if inputs.forcings and k > 1 and forcing is None:
        raise ConfigError(
            f"A {k}-step rollout of a forced model needs each step's forcings. Received: no "
            "'forcing' in the batch. Train on TrajectoryWindows over trajectories with forcings."
        )
    if step is None:
        step = spec.bind(xp, state_shape=state_shape, out_shape=state_shape, constant=to)
    in_map, y_map = spec.maps(state_shape, state_shape)
    channels = inputs.state_channels
    phys_u, _ = _units(to, in_map)
    _, norm_s = _units(to, in_map, channels)  # the state's channels of the input
    phys_y, norm_y = _units(to, y_map)

    clean = phys_u(x)
    if noise is None:
        u = clean
    else:  # the state channels only (every history slot), not forcings or static inputs
        mask = np.zeros(inputs.in_channels)
        mask[: inputs.history * inputs.channels] = 1.0
        u = phys_u(x + noise * to(mask))
    truth = clean[..., channels]
    previous = u[..., channels]
    total: Any = 0.0
    predicted = []
    for i in range(k):
        target = phys_y(y[:, i, ...])
        truth = truth + target if spec.residual else target
        nxt = step(model_fn, u)
        if backprop == "last" and i < k - 1:
            nxt = detach(nxt)
        term = loss_fn(norm_s(nxt), norm_s(truth))
        weight = float(weights[i])
        total = total + (term if weight == 1.0 else weight * term)
        if predictions:
            predicted.append(norm_y(nxt - previous) if spec.residual else norm_y(nxt))
        previous = nxt
        if i < k - 1:
            block = forcing[:, i + 1, ...] if inputs.forcings else None
            u = inputs.advance(xp, u, nxt, block)
            if not isinstance(backprop, str) and (i + 1) % int(backprop) == 0:
                u = detach(u)
    loss = _reduce(total, weights, reduction)
    return loss, (xp.stack(predicted, axis=1) if predictions else None)


def _ensemble_rollout_loss(
    xp: Any,
    *,
    spec: RolloutSpec,
    model_fn: Callable[[Any], Any],
    x: Any,
    y: Any,
    weights: Sequence[float],
    backprop: str | int,
    loss_fn: Callable[[Any, Any], Any],
    detach: Callable[[Any], Any],
    noise: Any,
    member_noise: Any,
    to: Callable[[np.ndarray], Any],
    predictions: bool,
    reduction: str,
) -> tuple[Any, Any]:
    """`rollout_loss` of a generative model: `M` members per sample (see there)."""
    if y.ndim == x.ndim:  # pairs (a one-step prediction, e.g. `state.predict`'s): one step
        weights = weights[:1]
    k = len(weights)
    if member_noise is None:
        raise ConfigError(
            "A generative model (an ensemble loss such as `crps`) is trained and evaluated "
            "on batches that carry its members' noise. Received: a batch without "
            "'member_noise'. Core's feed draws it; pass batch['member_noise'] "
            "(B, M, k, *spatial, noise_dim) when calling the loss yourself."
        )
    b, m = int(x.shape[0]), int(member_noise.shape[1])
    state_shape = tuple(int(d) for d in x.shape[1:])
    want = (b, m, *state_shape[:-1], spec.noise_channels)
    got = tuple(int(d) for d in member_noise.shape)
    if len(got) != len(want) + 1 or got[:2] + got[3:] != want or got[2] < k:
        raise ConfigError(
            f"`member_noise` must be (B, M, k, *spatial, noise_dim) = ({b}, M, >={k}, "
            f"{', '.join(str(d) for d in want[2:])}). Received: member_noise.shape={got}."
        )
    if y.ndim == x.ndim:
        y = xp.expand_dims(y, axis=1)
    step = spec.bind(
        xp, state_shape=state_shape, out_shape=state_shape, constant=to, stochastic=True
    )
    x_map, y_map = spec.maps(state_shape, state_shape)
    phys_x, norm_x = _units(to, x_map)
    phys_y, norm_y = _units(to, y_map)

    def tile(a: Any) -> Any:  # (B, ...) -> (B * M, ...), the members of a sample adjacent
        spread = xp.broadcast_to(xp.expand_dims(a, axis=1), (b, m, *state_shape))
        return xp.reshape(spread, (b * m, *state_shape))

    def members_of(a: Any) -> Any:  # (B * M, ...) -> (B, M, ...)
        return xp.reshape(a, (b, m, *state_shape))

    clean = phys_x(x)
    start = clean if noise is None else phys_x(x + noise)
    state = tile(start)
    truth, previous = clean, start
    total: Any = 0.0
    predicted = []
    for i in range(k):
        truth = truth + phys_y(y[:, i, ...]) if spec.residual else phys_y(y[:, i, ...])
        z = xp.reshape(member_noise[:, :, i, ...], (b * m, *want[2:]))
        nxt = step(model_fn, state, z, None)
        if backprop == "last" and i < k - 1:
            nxt = detach(nxt)
        ensemble = members_of(norm_x(nxt))
        target = norm_x(truth)
        if m == 1:  # the CRPS of one member: its absolute error
            term = xp.mean(xp.abs(ensemble[:, 0, ...] - target))
        else:
            term = loss_fn(ensemble, target)
        weight = float(weights[i])
        total = total + (term if weight == 1.0 else weight * term)
        if predictions:
            mean = xp.mean(members_of(nxt), axis=1)
            predicted.append(norm_y(mean - previous) if spec.residual else norm_y(mean))
            previous = mean
        state = nxt
        if not isinstance(backprop, str) and (i + 1) % int(backprop) == 0 and i < k - 1:
            state = detach(state)
    loss = _reduce(total, weights, reduction)
    return loss, (xp.stack(predicted, axis=1) if predictions else None)
