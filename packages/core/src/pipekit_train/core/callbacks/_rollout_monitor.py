"""`RolloutMonitor`: an emulator judged by its rollout at every validation.

A callback with the `validation_metrics` hook: at each validation it rolls held-out
trajectories out for `horizon` steps with the current weights (validation's evaluator,
so the moving average when the run keeps one) and adds the errors per lead-time window
and field (`rollout_validation`) to the validation's metrics. Any of them can then be the
monitored metric of best-k checkpoints, `EarlyStopping` and `ReduceLROnPlateau`. With
`members=M` a model with a probabilistic head is rolled out as an ensemble and judged by
its CRPS, spread–skill and rank histograms too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pipekit_train.core._checks import check_seed, is_int
from pipekit_train.core._errors import ConfigError
from pipekit_train.core.data.trajectories._inputs import ModelInputs
from pipekit_train.core.distributions._heads import head_for_loss, head_options_for_loss
from pipekit_train.core.metrics import DEFAULT_LEAD_BOUNDS
from pipekit_train.core.rollout._cycle import NeuralForward
from pipekit_train.core.rollout._noise import MEMBER_NOISE_KEY
from pipekit_train.core.rollout._validation import RolloutReport, rollout_validation
from pipekit_train.core.spec._rollout import Rollout

__all__ = ["RolloutMonitor"]


def _correction(rollout: Any) -> dict[str, Any]:
    """`NeuralForward`'s `coarse_stepper`/`correction` of a run's `rollout` JSON.

    None for a run of one-step rollouts: its evaluator answers a one-step call with a
    rollout of length 1 (`evaluates_as_rollout`), which takes the coarse step already.
    """
    if not isinstance(rollout, Mapping) or rollout.get("coarse_stepper") is None:
        return {}
    trained = Rollout.from_json(rollout)
    if trained.max_steps == 1:
        return {}
    return {"coarse_stepper": trained.coarse_stepper, "correction": trained.correction}


class RolloutMonitor:
    """Roll held-out trajectories out at every validation and record the errors.

    ```python
    monitor = RolloutMonitor(held_out, horizon=50, residual=True)
    TrainingLoop(
        ...,
        validate_every_n_steps=500,
        callbacks=[monitor, EarlyStopping(monitor="val_rollout_nrmse_lead_11_50")],
        checkpoint=Checkpoint("ckpt", keep_best=2, monitor="val_rollout_nrmse"),
    )
    ```

    The emulator step is exactly `NeuralForward`'s (normalise with the run's normalizer →
    model → head mean → de-normalise → plus the state with `residual=True`), applied to
    all trajectories and starts as one batch. The metrics are `RolloutReport.metrics`:
    `val_rollout_nrmse`, `val_rollout_nrmse_lead_1_1`, `val_rollout_vrmse_lead_2_10`, ...
    (per field too on a grid). The last report is kept (`last_report`) for its figure.
    It runs when the run validates (`validate_every_n_steps`, and at the end), so the run
    needs `validation=` data; the rollout adds to each validation the cost of `horizon`
    batched forward passes. A run whose model corrects a coarse stepper
    (`Rollout(coarse_stepper=..., correction=...)`) is rolled out with the corrected step,
    the stepper imported by the path the plan records and called on numpy arrays.

    **Ensembles.** With `members=M` (an int >= 2) each start is rolled out as `M` members,
    every step drawn from the distribution the model's head predicts
    (`NeuralForward.rollout(..., stochastic=True, seed=seed)`, on the host), so it needs
    a run whose loss trains a probabilistic head (`gaussian_nll`, `mixture_nll`,
    `flow_nll`, ...; a point head is refused at the start of training) of the state
    alone. The seed is the same at every validation: the same weights give the same
    ensemble, so the scores compare across validations and a resumed run repeats them.
    The metrics then add the ensemble's scores per lead window (`rollout_validation`'s
    `members`): `val_rollout_crps` (fair CRPS, lower is better: the one to monitor),
    `val_rollout_spread`, `val_rollout_ens_rmse`, `val_rollout_spread_skill` (about 1
    when calibrated) and `val_rollout_rank_flatness` (1 for a flat rank histogram of
    independent ranks, larger otherwise), each also `..._lead_{a}_{b}`; the nRMSE and
    VRMSE then score the ensemble mean. The cost is `horizon` forward passes on `M`
    times the batch. `monitor.persistence` stays the deterministic persistence baseline.

    Args:
        trajectories: held-out `Trajectories` (never the training split), or an array
            `(n_traj, T, *state_shape)`.
        horizon: the steps rolled out (`H`).
        residual: whether the model predicts the increment (as at training).
        starts: start times (indices along the trajectories).
        step: stored time steps per emulator step.
        spatial_ndim: the grid axes of a state before its channel axis (0 for vectors).
        per_channel: errors per channel (None: on a grid only).
        channels: channel names.
        bounds: last leads of the lead-time windows.
        prefix: prepended to the metric names.
        dt: the time one lead represents.
        members: roll each start out as an ensemble of this many members (an int >= 2;
            None: the head's mean, one rollout per start).
        seed: the seed of the ensemble's draws, the same at every validation.

    Raises:
        ConfigError: a bad argument, or a rollout that does not fit in the trajectories
            (checked here, before training, by a rollout of persistence); at the start of
            training, a run without validation data, or `members` with a run whose loss
            trains a point head or whose model sees more than the state.
    """

    def __init__(
        self,
        trajectories: Any,
        horizon: int,
        *,
        residual: bool = False,
        starts: int | Sequence[int] = (0,),
        step: int = 1,
        spatial_ndim: int = 0,
        per_channel: bool | None = None,
        channels: Sequence[str] | None = None,
        bounds: Sequence[int] = DEFAULT_LEAD_BOUNDS,
        prefix: str = "val_rollout_",
        dt: float = 1.0,
        members: int | None = None,
        seed: int = 0,
    ) -> None:
        if not isinstance(residual, bool):
            raise ConfigError(f"`residual` must be a bool. Received: residual={residual!r}.")
        if members is not None and (not is_int(members) or members < 2):
            raise ConfigError(
                f"`members` must be an int >= 2 (the ensemble's size). Received: "
                f"members={members!r}. Leave it out (None) to roll out the head's mean, or "
                "pass e.g. members=8."
            )
        self.seed = check_seed(seed)
        self.members = None if members is None else int(members)
        if not isinstance(prefix, str) or not prefix:
            raise ConfigError(
                f"`prefix` must be a non-empty string. Received: prefix={prefix!r}. "
                "Pass e.g. prefix='val_rollout_'."
            )
        self.trajectories = trajectories
        self.horizon = horizon
        self.residual = residual
        self.spatial_ndim = spatial_ndim
        # the names it adds to validation, as recorded (`val_` is added where missing)
        self.produces: tuple[str, ...] = (
            f"{prefix}*" if prefix.startswith("val_") else f"val_{prefix}*",
        )
        self._options: dict[str, Any] = {
            "starts": starts,
            "step": step,
            "spatial_ndim": spatial_ndim,
            "per_channel": per_channel,
            "channels": channels,
            "bounds": bounds,
            "prefix": prefix,
            "dt": dt,
        }
        # every argument checked now, not at the first validation: persistence (the state
        # held constant) rolled out once is the reference an emulator has to beat
        self.persistence: RolloutReport = rollout_validation(
            lambda states: states, trajectories, horizon, **self._options
        )
        self.last_report: RolloutReport | None = None
        self._head: tuple[str, dict[str, Any] | None] = ("point", None)

    def on_train_start(self, state: Any) -> None:
        """Refuse a run that never validates; read the head the run's loss implies."""
        if state.plan.get("validation") is None:
            raise ConfigError(
                "RolloutMonitor runs at each validation, but the run has none. Received: "
                "validation=None. Pass validation= data (and validate_every_n_steps=)."
            )
        loss = state.plan.get("loss")
        self._head = (head_for_loss(loss) or "point", head_options_for_loss(loss))
        if self.members is None:
            return
        if self._head[0] == "point":
            raise ConfigError(
                "RolloutMonitor(members=...) rolls out an ensemble drawn from the head's "
                f"predicted distribution, but the run's loss trains a point head. Received: "
                f"members={self.members}, loss={loss!r:.80}. Train a probabilistic head "
                "(e.g. loss='gaussian_nll'), or leave members out."
            )
        if state.plan.get("inputs") is not None:
            raise ConfigError(
                "RolloutMonitor(members=...) rolls an ensemble out with "
                "NeuralForward.rollout, which takes the state alone. Received: "
                f"members={self.members} for a model that sees history, forcings or static "
                "inputs. Leave members out."
            )

    def validation_metrics(self, state: Any) -> Mapping[str, float]:
        """Roll the trajectories out with the current weights; return the errors."""
        head, options = self._head

        inputs = state.plan.get("inputs")
        layout = None if inputs is None else ModelInputs.from_json(inputs)

        noise_dim = int((options or {}).get("noise_dim", 0)) if head == "generative" else 0

        def model(x_norm: np.ndarray) -> np.ndarray:
            x_in = np.asarray(x_norm, dtype=np.float32)
            extra: dict[str, np.ndarray] = {}
            if noise_dim:  # a generative model: one member per row, with the noise given
                x_in, z = x_in[..., :-noise_dim], x_in[..., -noise_dim:]
                extra[MEMBER_NOISE_KEY] = z[:, None, None]
            y = x_in if layout is None else x_in[..., layout.state_channels]
            pred = np.asarray(state.predict({"x": x_in, "y": np.zeros_like(y), **extra}))
            # a run trained through a one-step rollout evaluates pairs as a rollout of
            # length 1: its predicted targets `(B, 1, ...)` are the model's output
            return pred[:, 0] if pred.ndim == x_in.ndim + 1 else pred

        forward = NeuralForward(
            model,
            normalizer=state.normalizer,
            residual=self.residual,
            head=head,
            state_ndim=self.spatial_ndim + 1,
            inputs=layout,
            **(options or {}),
            **_correction(state.plan.get("rollout")),
        )
        self.last_report = rollout_validation(
            forward,
            self.trajectories,
            self.horizon,
            **self._options,
            members=self.members,
            seed=self.seed,
        )
        return self.last_report.metrics

    def __repr__(self) -> str:
        members = "" if self.members is None else f", members={self.members}, seed={self.seed}"
        return f"RolloutMonitor(horizon={self.horizon}, residual={self.residual}{members})"
