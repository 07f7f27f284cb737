"""Core's checks of `TrainingLoop(rollout=...)`, before any work."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.data import TrajectoryWindows
from pipekit_train.core.losses._ensemble import ENSEMBLE_LOSSES
from pipekit_train.core.rollout._train import check_rollout_loss
from pipekit_train.core.spec._rollout import Rollout
from pipekit_train.core.spec._steppers import check_stepper_shape

__all__ = ["check_rollout", "check_steppers", "model_inputs"]


def _check_windows(field: str, data: Any, rollout: Rollout) -> None:
    if not isinstance(data, TrajectoryWindows):
        raise ConfigError(
            f"Rollout training reads windows of consecutive states, so `{field}` must be a "
            f"`TrajectoryWindows`. Received: {field}={type(data).__name__} with "
            f"rollout=Rollout(steps={rollout.steps}). Cut windows out of trajectories: "
            f"TrajectoryWindows(trajectories, k={rollout.max_steps}"
            + (", targets='increments'" if rollout.residual else "")
            + ")."
        )
    if data.k < rollout.max_steps:
        raise ConfigError(
            f"The windows of `{field}` span k={data.k} steps, shorter than the longest "
            f"rollout ({rollout.max_steps} steps). Received: TrajectoryWindows(k={data.k}) "
            f"with rollout=Rollout(steps={rollout.steps}). Build the windows with "
            f"k >= {rollout.max_steps}."
        )
    wanted = "increments" if rollout.residual else "states"
    if data.targets != wanted:
        raise ConfigError(
            f"`residual` must agree with the targets of `{field}`: a residual model predicts "
            "increments, a non-residual one the next state. Received: "
            f"Rollout(residual={rollout.residual}) with TrajectoryWindows(targets="
            f"{data.targets!r}). Use targets={wanted!r}, or residual={not rollout.residual}."
        )


def check_rollout(rollout: Any, data: Any, validation: Any, loss: Any) -> Rollout | None:
    """`rollout` checked against the training description (None passes).

    Raises:
        ConfigError: `rollout` is not a `Rollout`, the data are not windows that cover
            the longest rollout with the targets `residual` implies, or the loss is not
            one rollout training defines.
    """
    if rollout is None:
        name = getattr(loss, "name", None)
        if name in ENSEMBLE_LOSSES:
            raise ConfigError(
                f"`{name}` scores an ensemble of members, which rollout training builds "
                "(each member rolled out from its own noise). Received: "
                f"loss={name!r} with rollout=None. Pass rollout=Rollout(steps=1) for "
                "one-step training (on TrajectoryWindows), or more steps."
            )
        return None
    if not isinstance(rollout, Rollout):
        raise ConfigError(
            "`rollout` must be a `Rollout` (pipekit_train.core.Rollout) or None. Received: "
            f"rollout={rollout!r}. E.g. rollout=Rollout(steps=4)."
        )
    _check_windows("data", data, rollout)
    if validation is not None:
        _check_windows("validation", validation, rollout)
    check_rollout_loss(loss)
    inputs = data.inputs
    if getattr(loss, "name", None) in ENSEMBLE_LOSSES:
        if not inputs.trivial or rollout.steppers:
            given = (
                "a reference or coarse stepper"
                if rollout.steppers
                else (f"windows that give the model {inputs.to_json()}")
            )
            raise ConfigError(
                "A generative model (an ensemble loss) takes the state and its noise alone "
                f"for now. Received: loss={loss.name!r} with {given}. Train it on windows "
                "of the state alone, with Rollout(target='trajectory') and no stepper."
            )
    if rollout.steppers and not inputs.trivial:
        fields = ", ".join(f"{name}=..." for name in rollout.steppers)
        raise ConfigError(
            "A stepper in the rollout advances the state alone, so it does not serve a "
            "model that sees history, forcings or static inputs yet. Received: "
            f"Rollout({fields}) with windows that give the model {inputs.to_json()}. "
            "Drop the stepper, or train on windows of the state alone."
        )
    return rollout


def check_steppers(adapter: Any, plan: Any) -> None:
    """Probe each stepper of `plan.rollout` once on the backend's zeros of the data's
    state shape (`Adapter.stepper_shape`, a batch of two), before any work.

    Raises:
        ConfigError: a stepper that fails on such states or returns another shape.
    """
    trajectories = getattr(plan.data, "trajectories", None)
    if trajectories is None:
        return
    shape = (2, *(int(d) for d in trajectories.state_shape))
    dtype = np.dtype(getattr(trajectories, "state_dtype", np.float32))
    if not np.issubdtype(dtype, np.floating):
        dtype = np.dtype(np.float32)
    for field, stepper in plan.rollout.steppers.items():
        try:
            out = adapter.stepper_shape(stepper, shape, dtype)
        except ConfigError:
            raise
        except Exception as exc:
            name = plan.rollout.stepper_name(field)
            raise ConfigError(
                f"`{field}` ({name}) failed on a batch of zero states of shape {shape} "
                f"({dtype.name}) on the {adapter.name!r} backend: {type(exc).__name__}: "
                f"{exc}. Received: {field}={name!r}. It must take a batch of physical states "
                "(batch axis first) in this backend's array library and return the next "
                "states."
            ) from exc
        check_stepper_shape(field, shape, out)


def model_inputs(data: Any, validation: Any) -> Any:
    """The model input's layout (`ModelInputs`) the windows of `data` deliver, or None
    for a model of the state alone.

    Raises:
        ConfigError: the validation windows deliver another layout.
    """
    inputs = getattr(data, "inputs", None) if isinstance(data, TrajectoryWindows) else None
    if inputs is not None and inputs.trivial:
        inputs = None
    if validation is not None and isinstance(validation, TrajectoryWindows):
        other = None if validation.inputs.trivial else validation.inputs
        if other != inputs:
            raise ConfigError(
                "The validation windows must give the model the inputs the training windows "
                f"give it. Received: data inputs {None if inputs is None else inputs.to_json()}, "
                f"validation inputs {None if other is None else other.to_json()}. Build both "
                "with the same history, static inputs and forcings."
            )
    return inputs
