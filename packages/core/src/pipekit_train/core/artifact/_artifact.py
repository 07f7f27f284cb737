"""`TrainingArtifact`: everything a finished run hands downstream."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.distributions._heads import head_for_loss, head_options_for_loss
from pipekit_train.core.metrics import DEFAULT_LEAD_BOUNDS

from ._history import History
from ._rollout_evaluation import artifact_rollout, rollout_options, rollout_window_loss

__all__ = ["TrainingArtifact"]


@dataclass
class TrainingArtifact:
    """The result of `TrainingLoop.run()`.

    Attributes:
        model: the trained model operator. With `optimizer_config["ema"]` it holds the
            moving average of the weights (what validation and the registry use).
        history: every metric written during the run.
        final_metrics: the last value of each metric.
        best_metric: the best value of the monitored metric (`val_loss` by default), if any.
        best_step: the step at which `best_metric` was reached.
        checkpoint_dir: where checkpoints were written, if any.
        weights_sha256: SHA-256 of `model.serialize_weights()`.
        plan: the frozen JSON plan of the run.
        backend: `"equinox"`, `"lightning"`, `"keras"` or `"numpy"`.
        versions: library versions the run used.
        wall_time_s: wall time of `run()` in seconds.
        steps_per_s: optimizer steps per second during this run.
        steps: total optimizer steps completed.
        resumed_from_step: the checkpoint step this run resumed from, if it resumed.
        stop_reason: why training stopped (`"max_steps"`, or a callback's reason).
        sweep_id: the sweep this run belongs to, if any.
        registry_uri: set by `register()`.
        normalizer: a normalizer that travels with the model to the registry, if any.
        raw_model: the operator with the weights as trained (not averaged). The same
            object as `model` unless the run kept an EMA (`optimizer_config["ema"]`).
        weights_step: the step whose weights `model` holds: `steps` (the last one), or,
            for a run with `restore_best=True`, the step of the best checkpoint by the
            monitored metric (usually `best_step`). None on construction means `steps`.
    """

    model: Any
    history: History
    final_metrics: dict[str, float]
    best_metric: float | None
    best_step: int | None
    checkpoint_dir: str | None
    weights_sha256: str
    plan: dict[str, Any]
    backend: str
    versions: dict[str, str]
    wall_time_s: float
    steps_per_s: float
    steps: int
    resumed_from_step: int | None = None
    stop_reason: str = "max_steps"
    sweep_id: str | None = None
    registry_uri: str | None = None
    normalizer: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    raw_model: Any = None
    weights_step: int | None = None

    def __post_init__(self) -> None:
        if self.raw_model is None:
            self.raw_model = self.model
        if self.weights_step is None:
            self.weights_step = self.steps

    @staticmethod
    def hash_weights(model: Any) -> str:
        """SHA-256 of a model operator's weight bytes."""
        return hashlib.sha256(model.serialize_weights()).hexdigest()

    def lineage(self) -> dict[str, Any]:
        """The lineage recorded with the model in a registry."""
        return {
            "plan": self.plan,
            "backend": self.backend,
            "versions": self.versions,
            "sweep_id": self.sweep_id,
            "steps": self.steps,
            "best_metric": self.best_metric,
            "best_step": self.best_step,
            "weights_step": self.weights_step,
            "weights_sha256": self.weights_sha256,
            "wall_time_s": self.wall_time_s,
        }

    def evaluate(
        self,
        data: Any,
        *,
        metrics: Any = None,
        batch_size: int | None = None,
        calibration: bool | Mapping[str, Any] = False,
        rollout: bool | Mapping[str, Any] = False,
    ) -> dict[str, float]:
        """The run's loss and metrics on `data` (e.g. a held-out test set).

        ```python
        test_metrics = artifact.evaluate(test, metrics=["mae"])  # {"loss": ..., "mae": ...}
        artifact.register(registry, "emulator", test_metrics=test_metrics)
        ```

        With `calibration=True` (a posterior: a run trained with `gaussian_nll`,
        `mixture_nll` or `flow_nll`, `data` held-out simulations with `x` and `y` the parameters) the
        calibration diagnostics' scalars are added (`sbc_chi2_pvalue_min`,
        `coverage_hpd_68`, `tarp_atc`, `calibrated`, …; see `calibration`); a dict
        passes options to `calibration` (`{"num_samples": 500, "seed": 1}`). Registered
        as `test_metrics` they land in the registry record.

        With `rollout=True` (an emulator, `data` windows of held-out trajectories) the
        trajectories under the windows are rolled out with the trained model and their
        errors per lead-time window and field are added (`rollout_nrmse`,
        `rollout_nrmse_lead_1_10`, `rollout_vrmse_lead_11_30`, …; see `rollout`); a
        dict passes options to `rollout` (`{"horizon": 50, "dt": 0.05}`). A run trained
        through the rollout (`TrainingLoop(rollout=...)`) reports as its `loss` the
        longest rollout's weighted loss on the windows, as its validation did.

        Computed with core's loss and metric definitions on the trained operator's own
        predictions (`artifact.model(x)` on numpy), in the units validation used (the
        run's normalizer is applied to the batches), so every backend gives the same
        numbers for the same weights. `pipekit_train.core.evaluate` does the same for an
        operator loaded from a registry.

        Args:
            data: a sized pipekit dataset whose samples hold `x` and `y`.
            metrics: metric names or callables; default: the run's metrics.
            batch_size: rows per prediction call; default: the run's batch size.
            calibration: add the calibration diagnostics (True, or a dict of options for
                `calibration()`).
            rollout: add the rollout errors on the held-out trajectories of `data` (True,
                or a dict of options for `rollout()`).

        Returns:
            `{"loss": ..., <metric>: ...}` as floats.
        """
        from ._evaluation import evaluate

        options: dict[str, Any] | None = None
        if calibration is True:
            options = {}
        elif isinstance(calibration, Mapping):
            options = dict(calibration)
        elif calibration is not False:
            raise ConfigError(
                "`calibration` must be True, False or a dict of options for "
                f"artifact.calibration(). Received: calibration={calibration!r}."
            )

        loss = self.plan.get("loss")
        if not isinstance(loss, dict) or not ({"name", "import_path"} & set(loss)):
            raise ConfigError(
                "The run's loss cannot be rebuilt from the plan, so `evaluate` cannot compute "
                f"it. Received: plan loss={loss!r}. Use pipekit_train.core.evaluate(artifact."
                "model, data, loss=your_loss) instead."
            )
        if metrics is None:
            metrics = _plan_metrics(self.plan.get("metrics") or {})
        if batch_size is None:
            batch_size = int(self.plan.get("batch_size") or 256)
        if options is not None:
            report = self.calibration(data, **options)  # refuses bad input before the loss
        rollout_opts = rollout_options(rollout)
        rollout_report = None
        if rollout_opts is not None:
            rollout_report = self.rollout(data, **rollout_opts)
        out = rollout_window_loss(
            self.model,
            data,
            self.plan,
            loss=loss,
            metrics=metrics,
            batch_size=batch_size,
            normalizer=self.normalizer,
        )
        if out is None:
            out = evaluate(
                self.model,
                data,
                loss=loss,
                metrics=metrics,
                batch_size=batch_size,
                normalizer=self.normalizer,
            )
        if options is not None:
            out.update(report.metrics())
        if rollout_report is not None:
            out.update(rollout_report.metrics)
        return out

    def rollout(
        self,
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
    ) -> Any:
        """Roll held-out trajectories out with the trained emulator and score them.

        ```python
        report = artifact.rollout(held_out, horizon=50, dt=0.05)
        report.metrics["rollout_nrmse_lead_11_50"]    # scalars for the registry
        report.figure("figures/rollout.png")          # error against lead time per field
        ```

        The emulator step is `NeuralForward`'s (the run's normalizer, the model on numpy,
        the head's mean, the residual), so every backend gives the same numbers for the
        same weights; the errors are `rollout_validation`'s (nRMSE and VRMSE per lead,
        lead-time window and field, and the spectral error on a grid).

        Args:
            trajectories: held-out `Trajectories`, `TrajectoryWindows` over them (their
                `step`, and `residual` from their targets) or an array
                `(n_traj, T, *state_shape)`.
            horizon: the steps rolled out; default: the whole trajectories.
            residual: whether the model predicts the increment; default: from the
                windows' targets, else the run's `Rollout`; required otherwise.
            starts: start times (indices along the trajectories).
            spatial_ndim: the grid axes of a state before its channel axis; default: all
                axes but the last (0 for vectors).
            per_channel: errors per channel (None: on a grid only).
            channels: channel names.
            bounds: last leads of the lead-time windows.
            prefix: prepended to the metric names.
            dt: the time one lead represents (the figure and the valid prediction time).
            members: roll each start out as an ensemble of this many members, drawn
                each step (Gaussian, mixture and generative heads; `rollout_validation`'s
                `members`): the report adds the CRPS, spread–skill and rank histograms.
                None: the head's mean (the central member of a generative model).
            seed: the seed of the members' draws.

        Returns:
            A `pipekit_train.core.RolloutReport`.

        Raises:
            ConfigError: bad trajectories or options, or `residual` unknown.
        """
        return artifact_rollout(
            self.model,
            self.normalizer,
            self.plan,
            trajectories,
            horizon,
            residual=residual,
            starts=starts,
            spatial_ndim=spatial_ndim,
            per_channel=per_channel,
            channels=channels,
            bounds=bounds,
            prefix=prefix,
            dt=dt,
            members=members,
            seed=seed,
        )

    def posterior(self, *, state_ndim: int = 1) -> Any:
        """The trained model as a posterior: a `NeuralForward` whose `distribution(x)` is
        a `Gaussian`, `Mixture` or `Flow` over the parameters, in their units (the head from
        the run's loss: `gaussian_nll`, `mixture_nll` or `flow_nll`).

        Args:
            state_ndim: the axes of one observation (2 for a set of points `(n, d)`).

        Raises:
            ConfigError: the run's loss implies no distribution.
        """
        from pipekit_train.core.rollout._posterior import posterior_forward

        return posterior_forward(
            self.model, self.normalizer, self.plan.get("loss"), state_ndim=state_ndim
        )

    def calibration(
        self,
        data: Any,
        *,
        num_samples: int = 200,
        seed: int = 0,
        alpha: float = 0.05,
        tolerance: float = 0.05,
        parameter_names: Any = None,
    ) -> Any:
        """SBC, expected coverage and TARP of the trained posterior on held-out simulations.

        ```python
        report = artifact.calibration(test, num_samples=200)
        report.passed, report.metrics()          # scalars for a writer or the registry
        report.plot("figures/calibration")       # sbc.png, coverage.png, tarp.png
        ```

        Args:
            data: held-out simulations: a sized pipekit dataset with `x` (observations)
                and `y` (the parameters they were simulated from, drawn from the prior).
            num_samples: posterior draws per simulation.
            seed: seeds the draws, the SBC band and TARP's reference points.
            alpha: the level of the SBC band and the KS tests.
            tolerance: the accepted coverage error at 50/68/95% for `passed`.
            parameter_names: names for the plots.

        Returns:
            A `pipekit_train.core.diagnostics.CalibrationReport`.

        Raises:
            ConfigError: a run whose loss implies no posterior, `data` without `x`/`y`,
                fewer than 20 simulations or draws.
        """
        from pipekit_train.core.diagnostics import run_calibration
        from pipekit_train.core.rollout._posterior import (
            check_posterior_loss,
            posterior_forward,
            simulations_of,
        )

        loss = self.plan.get("loss")
        check_posterior_loss(loss)
        x, theta = simulations_of(data)
        forward = posterior_forward(self.model, self.normalizer, loss, state_ndim=x.ndim - 1)
        return run_calibration(
            forward,
            theta,
            x,
            num_samples=num_samples,
            seed=seed,
            alpha=alpha,
            tolerance=tolerance,
            parameter_names=parameter_names,
        )

    def register(
        self,
        registry: Any,
        name: str,
        *,
        normalizer: Any = None,
        head: str | None = None,
        test_metrics: Mapping[str, float] | None = None,
        head_options: dict[str, Any] | None = None,
    ) -> Any:
        """Hand the trained model to a `ModelRegistry` and return its `ModelRecord`.

        Args:
            registry: a `ModelRegistry` (e.g. `LocalModelRegistry(root)`).
            name: the model name in the registry.
            normalizer: a `Normalizer` to store with the model (default: the run's).
            head: what the model's output means (`"gaussian"`, `"mixture"`, `"flow"`
                or `"point"`). Default: `"gaussian"` when the run's loss was
                `gaussian_nll`, `"mixture"` when it was `mixture_nll`, `"flow"` when it
                was `flow_nll`, else not recorded.
            head_options: the head's options (`{"n_components": K, "covariance": ...}`
                for a mixture, `{"flow_layers": ..., "flow_bins": ..., "flow_bound":
                ...}` for a flow, with `"flow_hidden"` when it is not 0). Default: the loss's parameters when the run's loss was
                `mixture_nll` (`flow_nll`) and the head is `"mixture"` (`"flow"`).
            test_metrics: held-out metrics (e.g. `artifact.evaluate(test)`), recorded
                beside the run's final metrics with a `test_` prefix (covered by the
                record's digest like every metric).
        """
        norm = normalizer if normalizer is not None else self.normalizer
        loss = self.plan.get("loss")
        if head is None:
            head = head_for_loss(loss)
        if head_options is None and head is not None and head == head_for_loss(loss):
            head_options = head_options_for_loss(loss)
        extra: dict[str, Any] = {} if head is None else {"head": head}
        if head_options is not None:
            extra["head_options"] = head_options
        recorded = dict(self.final_metrics)
        if test_metrics is not None:
            if not isinstance(test_metrics, Mapping):
                raise ConfigError(
                    "`test_metrics` must be a dict of metric names to numbers, as "
                    f"`artifact.evaluate(test)` returns. Received: test_metrics={test_metrics!r}."
                )
            for key, value in test_metrics.items():
                recorded[key if str(key).startswith("test_") else f"test_{key}"] = value
        record = registry.register(
            name,
            self.model,
            metrics=recorded,
            lineage=self.lineage(),
            normalizer=norm.to_json() if norm is not None and hasattr(norm, "to_json") else norm,
            **extra,
        )
        self.registry_uri = getattr(record, "uri", None)
        return record

    @property
    def inputs(self) -> Any:
        """The model input's layout (`ModelInputs`) when the model saw history, forcings
        or static inputs in training (`NeuralForward(..., inputs=artifact.inputs)`);
        None for a model of the state alone."""
        data = self.plan.get("inputs") if isinstance(self.plan, Mapping) else None
        if data is None:
            return None
        from pipekit_train.core.data.trajectories._inputs import ModelInputs

        return ModelInputs.from_json(data)

    @property
    def resume_note(self) -> str:
        """How this run started, for humans: `""` (from step 0), `"resumed at step N"`, or
        `"resumed at step N, nothing left to train"` (one wording for `summary()` and the CLI).
        """
        if self.resumed_from_step is None:
            return ""
        note = f"resumed at step {self.resumed_from_step}"
        if self.steps <= self.resumed_from_step:
            note += ", nothing left to train"
        return note

    def summary(self) -> str:
        """A one-paragraph human summary.

        A fresh run gives its steps, time and rate; a resumed one says where it resumed,
        and a rerun that had nothing left to do says so instead of a rate.
        """
        metrics = ", ".join(f"{k}={v:.4g}" for k, v in sorted(self.final_metrics.items()))
        note = self.resume_note
        if note and self.steps <= (self.resumed_from_step or 0):
            run = f"{self.steps} steps ({note})"
        else:
            ran = self.steps - (self.resumed_from_step or 0)
            done = f"{self.steps} steps ({note}, {ran} this run)" if note else f"{self.steps} steps"
            run = f"{done} in {self.wall_time_s:.1f}s ({self.steps_per_s:.1f} steps/s)"
        return f"{self.backend}: {run}; {metrics}; weights sha256 {self.weights_sha256[:12]}"


def _plan_metrics(described: Mapping[str, Any]) -> dict[str, Any]:
    """The run's metrics from the plan JSON: registered names, or importable callables."""
    from pipekit_train.core import metrics as metric_lib
    from pipekit_train.core._imports import import_string

    out: dict[str, Any] = {}
    for name, desc in described.items():
        if name in metric_lib.names():
            out[name] = name
        elif isinstance(desc, str) and ":" in desc:
            out[name] = import_string(desc, field=f"metrics[{name!r}]")
        else:
            raise ConfigError(
                f"The run's metric {name!r} cannot be rebuilt from the plan. Received: "
                f"{desc!r}. Pass metrics=[...] to evaluate()."
            )
    return out
