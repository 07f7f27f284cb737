"""A trained emulator judged on held-out trajectories after training, with no backend.

`TrainingArtifact.rollout` rolls held-out trajectories out with the artifact's model
(`NeuralForward`'s step: the run's normalizer, the model's numpy call, the head's mean,
the residual) and scores them with `rollout_validation`; `TrainingArtifact.evaluate(...,
rollout=...)` adds those scores to the held-out metrics, so `register(...,
test_metrics=...)` records them. For a run trained through the rollout,
`rollout_window_loss` is the loss validation reported: the longest rollout's weighted
loss over held-out windows (`rollout_loss` on numpy, without noise). A run whose model
corrects a coarse stepper is rolled out with it, imported by the path its plan records
and called on numpy arrays (a stepper written with the array API serves).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.data import (
    FORCING_KEY,
    ModelInputs,
    Trajectories,
    TrajectoryWindows,
    make_batches,
)
from pipekit_train.core.distributions._heads import head_for_loss, head_options_for_loss
from pipekit_train.core.losses._ensemble import ensemble_params
from pipekit_train.core.metrics import DEFAULT_LEAD_BOUNDS, resolve_metrics
from pipekit_train.core.rollout._cycle import NeuralForward
from pipekit_train.core.rollout._noise import MEMBER_NOISE_KEY, with_validation_members
from pipekit_train.core.rollout._train import rollout_loss, rollout_spec
from pipekit_train.core.rollout._validation import RolloutReport, rollout_validation
from pipekit_train.core.spec._rollout import Rollout

from ._evaluation import aggregate_batches

__all__ = ["artifact_rollout", "rollout_options", "rollout_window_loss"]

#: The options `evaluate(..., rollout={...})` passes on to `TrainingArtifact.rollout`.
ROLLOUT_OPTIONS = (
    "horizon",
    "residual",
    "starts",
    "spatial_ndim",
    "per_channel",
    "channels",
    "bounds",
    "prefix",
    "dt",
)


def rollout_options(rollout: Any) -> dict[str, Any] | None:
    """`evaluate`'s `rollout=` as options for `TrainingArtifact.rollout` (None: off).

    Raises:
        ConfigError: not a bool or a dict of known options.
    """
    if rollout is False:
        return None
    if rollout is True:
        return {}
    if isinstance(rollout, Mapping):
        unknown = sorted(set(rollout) - set(ROLLOUT_OPTIONS))
        if unknown:
            raise ConfigError(
                f"`rollout` options are {list(ROLLOUT_OPTIONS)}. Received: rollout={dict(rollout)!r} "
                f"(unknown: {unknown}). E.g. rollout={{'horizon': 50, 'dt': 0.05}}."
            )
        return dict(rollout)
    raise ConfigError(
        "`rollout` must be True, False or a dict of options for artifact.rollout() "
        f"(e.g. {{'horizon': 50}}). Received: rollout={rollout!r}."
    )


def _on_host(stepper: Any) -> Any:
    """A stepper's output on numpy states as a float64 numpy array."""

    def host(x: np.ndarray) -> np.ndarray:
        return np.asarray(stepper(x), dtype=np.float64)

    return host


def _plan_rollout(plan: Mapping[str, Any]) -> Rollout | None:
    data = plan.get("rollout")
    return None if data is None else Rollout.from_json(data)


def artifact_rollout(
    model: Any,
    normalizer: Any,
    plan: Mapping[str, Any],
    trajectories: Any,
    horizon: int | None = None,
    *,
    residual: bool | None = None,
    starts: int | Sequence[int] = (0,),
    spatial_ndim: int | None = None,
    per_channel: bool | None = None,
    channels: Sequence[str] | None = None,
    bounds: Sequence[int] = DEFAULT_LEAD_BOUNDS,
    prefix: str = "rollout_",
    dt: float = 1.0,
    members: int | None = None,
    seed: int = 0,
) -> RolloutReport:
    """`TrainingArtifact.rollout` (its arguments are documented there)."""
    step = 1
    if isinstance(trajectories, TrajectoryWindows):
        if residual is None:
            residual = trajectories.targets == "increments"
        step = trajectories.step
        trajectories = trajectories.trajectories
    elif isinstance(trajectories, np.ndarray):
        trajectories = Trajectories(trajectories)
    if not isinstance(trajectories, Trajectories):
        raise ConfigError(
            "`trajectories` must be held-out `Trajectories`, `TrajectoryWindows` or an array "
            f"(n_traj, T, *state_shape). Received: trajectories={type(trajectories).__name__}."
        )
    trained = _plan_rollout(plan)
    if residual is None:
        if trained is None:
            raise ConfigError(
                "`residual` says whether the model predicts the increment, and this run's "
                "plan does not (it was not trained through the rollout). Received: "
                "residual=None with Trajectories. Pass residual=True or residual=False."
            )
        residual = trained.residual
    if not isinstance(residual, bool):
        raise ConfigError(f"`residual` must be a bool. Received: residual={residual!r}.")
    state_ndim = len(trajectories.state_shape)
    if spatial_ndim is None:
        spatial_ndim = state_ndim - 1  # channels-last: the axes before the channel axis
    if horizon is None:
        horizon = (trajectories.length - 1) // step  # the whole held-out trajectories
    loss = plan.get("loss")
    head = head_for_loss(loss) or "point"

    def predict(x_norm: np.ndarray) -> np.ndarray:
        return np.asarray(model(np.asarray(x_norm, dtype=np.float32)))

    corrected: dict[str, Any] = {}
    if trained is not None and trained.coarse_stepper is not None:
        # the model corrects a solver: every step calls it, on numpy arrays here
        corrected = {"coarse_stepper": trained.coarse_stepper, "correction": trained.correction}
    forward = NeuralForward(
        predict,
        normalizer=normalizer,
        residual=residual,
        head=head,
        state_ndim=state_ndim,
        inputs=None if plan.get("inputs") is None else ModelInputs.from_json(plan["inputs"]),
        **(head_options_for_loss(loss) or {}),
        **corrected,
    )
    return rollout_validation(
        forward,
        trajectories,
        horizon,
        starts=starts,
        step=step,
        spatial_ndim=spatial_ndim,
        per_channel=per_channel,
        channels=channels,
        bounds=bounds,
        prefix=prefix,
        dt=dt,
        members=members,
        seed=seed,
    )


def rollout_window_loss(
    model: Any,
    data: Any,
    plan: Mapping[str, Any],
    *,
    loss: Any,
    metrics: Any,
    batch_size: int,
    normalizer: Any,
) -> dict[str, float] | None:
    """The loss and metrics of a rollout-trained run on held-out windows (None: not one).

    The longest rollout's weighted loss, without noise, as the run's validation computed
    it; the metrics compare the predicted targets `(B, k, *state)` with the windows'.

    Raises:
        ConfigError: `data` are not windows that cover the run's longest rollout with
            the targets it was trained on.
    """
    from pipekit_train.core import losses

    trained = _plan_rollout(plan)
    if trained is None:
        return None
    wanted = "increments" if trained.residual else "states"
    if (
        not isinstance(data, TrajectoryWindows)
        or data.k < trained.max_steps
        or data.targets != wanted
    ):
        got = type(data).__name__
        if isinstance(data, TrajectoryWindows):
            got = f"TrajectoryWindows(k={data.k}, targets={data.targets!r})"
        raise ConfigError(
            "This run was trained through the rollout, so its loss is measured on windows "
            f"of held-out trajectories. Received: data={got}. Use TrajectoryWindows("
            f"held_out, k>={trained.max_steps}, targets={wanted!r})."
        )
    loss_fn = losses.get(loss)
    ensemble = ensemble_params(loss_fn.describe()) if hasattr(loss_fn, "describe") else None
    coarse = trained.coarse_stepper
    spec = rollout_spec(
        normalizer,
        trained.residual,
        len(data.trajectories.state_shape),
        data.inputs,
        coarse_stepper=None if coarse is None else _on_host(coarse),
        correction=trained.correction,
        noise_dim=None if ensemble is None else ensemble[1],
    )
    weights = trained.step_weights(trained.max_steps)

    def model_fn(x_norm: Any) -> Any:
        return np.asarray(model(np.asarray(x_norm, dtype=np.float32)), dtype=np.float64)

    def eval_batch(batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray, float]:
        value, pred = rollout_loss(
            np,
            spec=spec,
            model_fn=model_fn,
            x=np.asarray(batch["x"], np.float64),
            y=np.asarray(batch["y"], np.float64),
            weights=weights,
            backprop="full",
            loss_fn=loss_fn,
            forcing=None
            if FORCING_KEY not in batch
            else np.asarray(batch[FORCING_KEY], np.float64),
            member_noise=batch.get(MEMBER_NOISE_KEY),
        )
        return pred, float(value)

    k, x_ndim = len(weights), 1 + len(data.trajectories.state_shape)

    def leading(batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        y = np.asarray(batch["y"])
        y = y[:, None] if y.ndim == x_ndim else y  # (B, K, *state), then the first k
        return {**batch, "y": y[:, :k]}

    batches: Any = make_batches(
        data, int(batch_size), seed=0, shuffle=False, drop_remainder=False, num_epochs=1
    )
    if ensemble is not None:  # a generative model: the members validation scores
        members = (ensemble[0], trained.max_steps, ensemble[1])
        batches = with_validation_members(batches, seed=int(plan.get("seed") or 0), members=members)
    return aggregate_batches(
        (leading(b) for b in batches),
        eval_batch,
        resolve_metrics(metrics),
        normalizer=normalizer,
    )
