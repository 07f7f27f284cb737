"""`rollout_validation`: roll held-out trajectories out with a forward operator and score them.

The forward operator is any callable batch of states → next states (a simulator, a
`NeuralForward` on any backend). From each held-out trajectory and each start time it
is applied `horizon` times; the predictions are compared with the trajectory's own
states at the same leads with The Well's nRMSE and VRMSE per field (and the binned
spectral error on a 1-D or 2-D grid), per lead time and per lead-time window
(`pipekit_train.core.metrics`). `RolloutReport.metrics` holds them as scalars with
monitorable names (`"val_rollout_nrmse"`, `"val_rollout_nrmse_lead_1_10"`, ...);
`RolloutReport.figure()` draws the error against lead time per field.

With `members=M` a `NeuralForward` with a probabilistic head rolls each start out as an
ensemble of `M` members (`forward.rollout(..., stochastic=True, seed=seed)`); the report
then adds the ensemble's CRPS, spread, ensemble-mean RMSE, spread–skill ratio and rank
histograms per lead (`metrics.ensemble_lead_metrics`), and `RolloutReport.ensemble_figure()`
draws them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from pipekit_train.core._checks import check_seed, is_int, positive_int
from pipekit_train.core._errors import ConfigError
from pipekit_train.core._imports import optional_import
from pipekit_train.core.data.trajectories._trajectories import Trajectories
from pipekit_train.core.metrics._ensemble import ensemble_lead_metrics
from pipekit_train.core.metrics._field_errors import nrmse, vrmse
from pipekit_train.core.metrics._lead_time import (
    DEFAULT_LEAD_BOUNDS,
    lead_windows,
    rollout_errors,
    summarize,
    valid_prediction_time,
)

from ._cycle import NeuralForward
from ._step import NonFiniteStateError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["RolloutReport", "rollout_validation"]


@dataclass
class RolloutReport:
    """The errors of a validation rollout.

    Attributes:
        errors: per lead and channel, `{"nrmse": (H, C), "vrmse": (H, C)}` (plus
            `"spectral": (H, n_bins, C)` on a grid), averaged over trajectories and starts.
            A diverged rollout (NaN or inf predictions) scores `inf`.
        metrics: the same as named scalars (`metrics.summarize`), e.g.
            `"val_rollout_nrmse_lead_1_10"`.
        windows: the lead-time windows of `metrics`.
        channels: the channel names.
        dt: the time one lead represents.
        predictions: the rollouts `(n, H, *state_shape)` (`n` = trajectories × starts);
            with an ensemble, its mean over the members.
        targets: the true states at the same leads.
        spatial_ndim: the grid axes of a state (as for `metrics.nrmse`).
        per_channel: whether the errors are per channel (as for `metrics.nrmse`).
        ensemble: with `members=M`, the members' rollouts `(n, H, M, *state_shape)`;
            else empty.
        ensemble_errors: with `members=M`, `metrics.ensemble_lead_metrics` of the
            ensemble: `"crps"`, `"spread"`, `"ens_rmse"`, `"spread_skill"` `(H, C)`,
            `"rank_histogram"` `(H, M + 1)`, `"rank_flatness"` `(H, 1)`; else empty.
    """

    errors: dict[str, np.ndarray]
    metrics: dict[str, float]
    windows: list[tuple[int, int]]
    channels: list[str]
    dt: float = 1.0
    predictions: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    targets: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    spatial_ndim: int = 0
    per_channel: bool = False
    ensemble: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    ensemble_errors: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def horizon(self) -> int:
        """The number of leads."""
        return int(next(iter(self.errors.values())).shape[0])

    @property
    def members(self) -> int | None:
        """The ensemble's members `M`, or None for a rollout of one member per start."""
        return int(self.ensemble.shape[2]) if self.ensemble_errors else None

    def valid_prediction_time(
        self, threshold: float = 0.5, metric: str = "nrmse", *, mean: bool = True
    ) -> Any:
        """Time (in units of `dt`) each rollout stays at or below `threshold`.

        Per rollout (each trajectory and start), on its `metric` per lead averaged over
        channels: `dt` times the leads before the error first exceeds `threshold`
        (`metrics.valid_prediction_time`; the full horizon if it never does).

        Args:
            threshold: the largest acceptable error (e.g. 0.5 for nRMSE).
            metric: `"nrmse"` or `"vrmse"`.
            mean: the mean over the rollouts (default), else one value per rollout.
        """
        if metric not in ("nrmse", "vrmse"):
            raise ConfigError(f"`metric` must be 'nrmse' or 'vrmse'. Received: metric={metric!r}.")
        fn = nrmse if metric == "nrmse" else vrmse
        with np.errstate(all="ignore"):
            per = np.asarray(
                fn(
                    self.predictions,
                    self.targets,
                    spatial_ndim=self.spatial_ndim,
                    per_channel=self.per_channel,
                )
            )
        if self.per_channel:
            per = per.mean(axis=-1)
        per = np.where(np.isfinite(per), per, np.inf)
        times = valid_prediction_time(per, threshold, dt=self.dt)
        return float(np.mean(times)) if mean else times

    def figure(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        metric: str = "nrmse",
        title: str | None = None,
    ) -> Figure:
        """Error against lead time, one line per field, as a matplotlib `Figure` (Agg).

        Args:
            path: also save it there as PNG (needs the `plot` extra, like every figure).
            metric: `"nrmse"` or `"vrmse"`.
            title: the figure title (default: the metric and the horizon).
        """
        if metric not in ("nrmse", "vrmse"):
            raise ConfigError(f"`metric` must be 'nrmse' or 'vrmse'. Received: metric={metric!r}.")
        optional_import("matplotlib", extra="plot", package="pipekit-train-core")
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        values = self.errors[metric]
        leads = np.arange(1, values.shape[0] + 1) * self.dt
        fig = Figure(figsize=(7, 4.2), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        for i, name in enumerate(self.channels):
            ax.plot(leads, values[:, i], label=name, lw=1.5 if len(self.channels) < 8 else 0.8)
        if len(self.channels) > 1:
            ax.plot(leads, values.mean(axis=1), color="k", lw=2.5, label="mean over fields")
        for first, _ in self.windows[1:]:
            ax.axvline((first - 0.5) * self.dt, color="0.7", lw=0.8, ls=":")
        positive = values[np.isfinite(values)]
        if positive.size and positive.min() > 0 and positive.max() / positive.min() > 10:
            ax.set_yscale("log")
        unit = "emulator steps" if self.dt == 1.0 else "time"
        ax.set(
            xlabel=f"lead ({unit})",
            ylabel=f"{metric} (1 = error as large as the target's "
            + ("RMS)" if metric == "nrmse" else "std)"),
            title=title or f"{metric} against lead time, {self.horizon} steps",
        )
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, ncol=2 if len(self.channels) > 6 else 1)
        if path is not None:
            fig.savefig(os.fspath(path), format="png")
        return fig

    def ensemble_figure(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        leads: Sequence[int] | None = None,
        title: str | None = None,
    ) -> Figure:
        """Spread–skill against lead time and rank histograms, as a matplotlib `Figure` (Agg).

        Left: the ensemble's spread and the RMSE of its mean against lead (averaged over
        channels; a calibrated ensemble has them about equal, the spread times
        `sqrt((M + 1) / M)`, as `spread_skill` counts it). Right: the rank histograms at
        a few leads as frequencies, with the flat line `1 / (M + 1)`.

        Args:
            path: also save it there as PNG (needs the `plot` extra, like every figure).
            leads: the leads whose rank histograms are drawn (1-based; default the first,
                the middle and the last).
            title: the figure title (default: the members and the horizon).

        Raises:
            ConfigError: a report without an ensemble (`members=` not given), or a lead
                outside `1..H`.
        """
        if self.members is None:
            raise ConfigError(
                "`ensemble_figure()` draws an ensemble's scores, but this report has one "
                "member per start. Received: members=None. Pass members=M (M >= 2) to "
                "rollout_validation or RolloutMonitor."
            )
        h = self.horizon
        chosen = sorted({1, (h + 1) // 2, h}) if leads is None else list(leads)
        if not chosen or any(not is_int(k) or not 1 <= k <= h for k in chosen):
            raise ConfigError(
                f"`leads` must be leads in 1..{h}. Received: leads={leads!r}. "
                f"Use e.g. leads=(1, {h})."
            )
        optional_import("matplotlib", extra="plot", package="pipekit-train-core")
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        m = int(self.members)
        scores = self.ensemble_errors
        times = np.arange(1, h + 1) * self.dt
        factor = np.sqrt((m + 1) / m)
        fig = Figure(figsize=(11, 4.2), dpi=100)
        FigureCanvasAgg(fig)
        left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
        left.plot(times, scores["ens_rmse"].mean(axis=1), color="C3", lw=2, label="RMSE of mean")
        left.plot(
            times,
            factor * scores["spread"].mean(axis=1),
            color="C0",
            lw=2,
            label=f"spread × √((M+1)/M), M={m}",
        )
        for first, _ in self.windows[1:]:
            left.axvline((first - 0.5) * self.dt, color="0.7", lw=0.8, ls=":")
        unit = "emulator steps" if self.dt == 1.0 else "time"
        left.set(xlabel=f"lead ({unit})", ylabel="state units", title="spread and skill")
        left.grid(True, alpha=0.3)
        left.legend(fontsize=8)
        ranks = np.arange(m + 1)
        for k in chosen:
            counts = scores["rank_histogram"][k - 1].astype(np.float64)
            total = counts.sum()
            freq = counts / total if total > 0 else np.full(m + 1, np.nan)
            right.step(ranks, freq, where="mid", lw=1.5, label=f"lead {k}")
        right.axhline(1.0 / (m + 1), color="k", lw=1, ls="--", label="flat")
        right.set(
            xlabel=f"rank of the truth among {m} members",
            ylabel="frequency",
            title="rank histograms",
        )
        right.grid(True, alpha=0.3)
        right.legend(fontsize=8)
        fig.suptitle(title or f"ensemble of {m} members, {h} steps")
        if path is not None:
            fig.savefig(os.fspath(path), format="png")
        return fig


def _check_members(forward: Any, members: Any, seed: Any) -> int | None:
    """`members` as an int >= 2 (or None), after checking the forward can make an ensemble."""
    check_seed(seed)
    if members is None:
        return None
    if not is_int(members) or members < 2:
        raise ConfigError(
            f"`members` must be an int >= 2 (the ensemble's size). Received: members={members!r}. "
            "Leave it out (None) for one deterministic rollout per start, or pass e.g. members=8."
        )
    if not isinstance(forward, NeuralForward):
        raise ConfigError(
            "An ensemble rollout (members=) samples each step from the model's predicted "
            f"distribution, which needs a NeuralForward. Received: forward={forward!r:.80} "
            f"with members={members}. Wrap the model as NeuralForward(model_op, normalizer, "
            "head=...), or leave members out."
        )
    if forward.head == "point":
        raise ConfigError(
            "An ensemble rollout (members=) samples each step from the model's predicted "
            f"distribution, but a point head predicts none. Received: members={members} with "
            "head='point'. Train a probabilistic head (e.g. loss='gaussian_nll') and pass its "
            "head to NeuralForward, or leave members out."
        )
    if forward.inputs is not None:
        raise ConfigError(
            "An ensemble rollout (members=) runs `NeuralForward.rollout`, which takes the "
            f"state alone. Received: members={members} with a model that sees history, "
            "forcings or static inputs (NeuralForward(inputs=...)). Leave members out."
        )
    return int(members)


def _ensemble_rollout(
    forward: NeuralForward, x0: np.ndarray, horizon: int, members: int, seed: int
) -> np.ndarray:
    """`members` stochastic rollouts of each start: `(n, H, M, *state)`, NaN past a divergence.

    A rollout that becomes non-finite at step `k` is run again for `k - 1` steps with the
    same seed (the same draws), so the leads before `k` keep their values.
    """
    n = x0.shape[0]
    batch = np.repeat(x0, members, axis=0)  # start i's members at rows i*M .. i*M + M - 1
    out = np.full((horizon, n * members, *x0.shape[1:]), np.nan)
    try:
        out[:] = forward.rollout(batch, horizon, stochastic=True, seed=seed)[1:]
    except NonFiniteStateError as error:
        good = 0 if error.step is None else int(error.step) - 1
        if good > 0:
            out[:good] = forward.rollout(batch, good, stochastic=True, seed=seed)[1:]
    out = out.reshape(horizon, n, members, *x0.shape[1:])
    return np.moveaxis(out, 0, 1)


def _starts(starts: Any, length: int, span: int) -> list[int]:
    values = [starts] if is_int(starts) else list(starts)
    if not values or any(not is_int(s) or s < 0 for s in values):
        raise ConfigError(
            f"`starts` must be non-negative time indices. Received: starts={starts!r}. "
            "Use e.g. starts=(0,) or starts=range(0, 100, 25)."
        )
    latest = length - span
    late = [int(s) for s in values if s > latest]
    if late:
        raise ConfigError(
            f"A rollout from every start must fit in the trajectories. Received: starts "
            f"{late}, but with T={length} states a rollout of {span - 1} stored steps starts at "
            f"{latest} at the latest. Use earlier starts or a shorter horizon."
        )
    return [int(s) for s in values]


def rollout_validation(
    forward: Callable[[np.ndarray], Any],
    trajectories: Trajectories | Any,
    horizon: int,
    *,
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
) -> RolloutReport:
    """Roll held-out trajectories out for `horizon` steps and score them per lead and field.

    From every trajectory and every start `s` the state at `s` is advanced `horizon`
    times with `forward` (all trajectories and starts as one batch) and lead `h` is
    compared with the stored state at `s + h * step`.

    A forward whose model sees history, forcings or static inputs (a `NeuralForward`
    with `inputs`) starts from the state at `s + (history - 1) * step`, with the states
    before it as its history, and gets each trajectory's static inputs and each step's
    forcings from `trajectories`.

    Args:
        forward: a callable batch of states `(n, *state_shape)` → next states (one
            emulator step), e.g. `NeuralForward(model_op, normalizer, residual=True)`.
        trajectories: held-out `Trajectories` (never the training split), or an array
            `(n_traj, T, *state_shape)`.
        horizon: the number of steps rolled out (`H`).
        starts: start times (indices along the trajectories).
        step: stored time steps per emulator step.
        spatial_ndim: the grid axes of a state before its channel axis (0 for vectors).
        per_channel: errors per channel; None: True on a grid, False for vectors (the
            variables of a vector state are pooled into one field, `"state"`).
        channels: names of the channels (default `"c0"`, `"c1"`, ...).
        bounds: last leads of the lead-time windows (`metrics.lead_windows`).
        prefix: prepended to the metric names.
        dt: the time one lead represents (for the figure and the valid prediction time).
        members: roll each start out as an ensemble of this many members (an int >= 2;
            None: one deterministic rollout). Needs a `NeuralForward` with a probabilistic
            head (Gaussian, mixture, flow, ...) of the state alone: the ensemble is
            `forward.rollout(starts repeated M times, horizon, stochastic=True,
            seed=seed)`, each step drawn from the predicted distribution. The report
            then adds the ensemble scores per lead and window
            (`metrics.ensemble_lead_metrics`): `f"{prefix}crps"`, `..._spread`,
            `..._ens_rmse`, `..._spread_skill` (per field too on a grid) and
            `..._rank_flatness`, each also `..._lead_{a}_{b}`; nRMSE and VRMSE (and the
            spectral error, the valid prediction time) then score the ensemble mean.
            A member that diverges makes every score `inf` from its lead on.
        seed: the seed of the ensemble's draws (and of the rank ties): the same seed gives
            the same ensemble for the same weights.

    Returns:
        A `RolloutReport`.

    Raises:
        ConfigError: a bad argument, a rollout that does not fit in the trajectories,
            a forward operator that changes the state's shape, or `members` with a
            forward that cannot sample (not a `NeuralForward`, a point head, a model with
            inputs beyond the state).
    """
    if not callable(forward):
        raise ConfigError(
            f"`forward` must be a callable state -> next state. Received: forward={forward!r}."
        )
    members = _check_members(forward, members, seed)
    if not isinstance(trajectories, Trajectories):
        if not isinstance(trajectories, np.ndarray):
            raise ConfigError(
                "`trajectories` must be `Trajectories` or an array (n_traj, T, ...). "
                f"Received: trajectories={type(trajectories).__name__}."
            )
        trajectories = Trajectories(trajectories)
    horizon = positive_int("horizon", horizon)
    step = positive_int("step", step)
    layout = getattr(forward, "inputs", None)  # a NeuralForward of a model with ModelInputs
    back = 0 if layout is None else layout.history - 1
    span = (horizon + back) * step + 1
    if span > trajectories.length:
        raise ConfigError(
            f"A rollout of horizon={horizon} steps of step={step} needs {span} states, but the "
            f"trajectories have T={trajectories.length}. Received: horizon={horizon}. Use "
            f"horizon <= {(trajectories.length - 1) // step} or longer trajectories."
        )
    start_list = _starts(starts, trajectories.length, span)
    windows = lead_windows(horizon, bounds)
    if isinstance(dt, bool) or not isinstance(dt, (int, float)) or not dt > 0:
        raise ConfigError(f"`dt` must be a positive number. Received: dt={dt!r}.")
    if per_channel is None:
        per_channel = spatial_ndim > 0
    n = len(trajectories)
    items = np.repeat(np.arange(n), len(start_list))
    t0 = np.tile(np.asarray(start_list), n)
    times = t0[:, None] + np.arange(back + horizon + 1)[None, :] * step
    states, static, forcings = trajectories.window(items, times)
    past = [states[:, j] for j in range(back)]
    states = states[:, back:]
    x = states[:, 0]
    preds = np.empty((len(items), horizon, *x.shape[1:]), dtype=np.float64)
    ensemble = np.zeros(0)
    if members is not None:
        # a NeuralForward (checked by _check_members), whose rollout checks the shapes
        ensemble = _ensemble_rollout(cast(NeuralForward, forward), x, horizon, members, seed)
        with np.errstate(all="ignore"):
            preds[:] = ensemble.mean(axis=2)
    for h in range(horizon if members is None else 0):
        if layout is None:
            x = np.asarray(forward(x))
        else:
            x_now = x
            forced: Any = forward  # a forward with `inputs` takes them as keywords
            x = np.asarray(
                forced(
                    x,
                    history=np.stack(past, axis=1) if past else None,
                    static=static,
                    forcing={k: v[:, back + h] for k, v in forcings.items()},
                )
            )
            past = [*past[1:], x_now] if past else []
        if x.shape != states.shape[:1] + states.shape[2:]:
            raise ConfigError(
                "`forward` must return next states of the input's shape. Received: input "
                f"shape {states.shape[:1] + states.shape[2:]}, output shape {x.shape} at lead "
                f"{h + 1}. Check the model's output size (or NeuralForward's residual/state_ndim)."
            )
        preds[:, h] = x
    targets = states[:, 1:].astype(np.float64)
    with np.errstate(all="ignore"):
        errors = rollout_errors(preds, targets, spatial_ndim=spatial_ndim, per_channel=per_channel)
    errors = {k: np.where(np.isfinite(v), v, np.inf) for k, v in errors.items()}
    c = errors["nrmse"].shape[-1]
    if channels is None:
        names = ["state"] if not per_channel else [f"c{i}" for i in range(c)]
    else:
        names = list(channels)
    if len(names) != c:
        raise ConfigError(
            f"`channels` must name each of the {c} channels. Received: channels={names!r}."
        )
    flat = summarize(errors, windows, channels=names, prefix=prefix)
    scores: dict[str, np.ndarray] = {}
    if members is not None:
        scores = ensemble_lead_metrics(
            ensemble, targets, member_axis=2, per_channel=per_channel, seed=seed
        )
        per_field = {k: scores[k] for k in ("crps", "spread", "ens_rmse", "spread_skill")}
        flat.update(summarize(per_field, windows, channels=names, prefix=prefix))
        flat.update(summarize({"rank_flatness": scores["rank_flatness"]}, windows, prefix=prefix))
    return RolloutReport(
        errors,
        flat,
        windows,
        names,
        float(dt),
        preds,
        targets,
        spatial_ndim,
        per_channel,
        ensemble,
        scores,
    )
