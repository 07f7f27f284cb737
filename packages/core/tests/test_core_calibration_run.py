"""Calibration wired into runs: `TrainingArtifact.calibration`/`evaluate(calibration=...)`,
the registry record, and `CalibrationMonitor` (every n updates, through the run's evaluator).

The model is the exact posterior of a gaussian_linear problem written as a Gaussian head
(mean and log-variance in the normaliser's units), so the expected answer is known: the
exact one is calibrated, one with half the spread is not.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipekit_train.core import (
    ArrayDataset,
    CalibrationMonitor,
    ConfigError,
    History,
    LocalModelRegistry,
    Normalizer,
    TrainingArtifact,
    TrainingLoop,
)
from pipekit_train.core.contract._adapter import NotSupportedError
from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp, regression_task

N, D = 600, 2
POST_VAR = 0.05  # θ ~ N(0, 0.1 I), x | θ ~ N(θ, 0.1 I): θ | x ~ N(x / 2, 0.05 I)


def _simulations(seed: int = 0, n: int = N) -> ArrayDataset:
    rng = np.random.default_rng(seed)
    theta = rng.normal(0.0, math.sqrt(0.1), (n, D)) * 3.0 + 1.0  # θ' = 3θ + 1: not unit scale
    x = (theta - 1.0) / 3.0 + rng.normal(0.0, math.sqrt(0.1), (n, D))
    return ArrayDataset(x=x.astype(np.float32), y=theta.astype(np.float32))


class ExactHead:
    """The exact posterior of θ' = 3θ + 1 as a Gaussian head in the normaliser's units."""

    def __init__(self, norm: Normalizer, spread: float = 1.0) -> None:
        self.mx, self.sx = norm.mean["x"], norm.std["x"]
        self.my, self.sy = norm.mean["y"], norm.std["y"]
        self.spread = spread

    def __call__(self, x_n: np.ndarray) -> np.ndarray:
        x = np.asarray(x_n, np.float64) * self.sx + self.mx
        mean = 3.0 * (x / 2.0) + 1.0
        var = 9.0 * POST_VAR * self.spread**2
        mean_n = (mean - self.my) / self.sy
        log_var_n = np.log(var / self.sy**2) * np.ones_like(mean_n)
        return np.concatenate([mean_n, log_var_n], axis=-1).astype(np.float32)


def _artifact(model: Any, norm: Normalizer | None, loss: Any) -> TrainingArtifact:
    return TrainingArtifact(
        model=model,
        history=History(),
        final_metrics={},
        best_metric=None,
        best_step=None,
        checkpoint_dir=None,
        weights_sha256="0" * 64,
        plan={"loss": loss, "batch_size": 64},
        backend="numpy",
        versions={},
        wall_time_s=0.0,
        steps_per_s=0.0,
        steps=0,
        normalizer=norm,
    )


@pytest.fixture(scope="module")
def held_out() -> tuple[ArrayDataset, Normalizer]:
    data = _simulations()
    return data, Normalizer.fit(_simulations(seed=9), keys=("x", "y"))


def test_artifact_calibration_passes_the_exact_posterior_and_fails_a_narrow_one(held_out) -> None:
    data, norm = held_out
    loss = {"name": "gaussian_nll"}
    exact = _artifact(ExactHead(norm), norm, loss).calibration(data, num_samples=100)
    narrow = _artifact(ExactHead(norm, spread=0.5), norm, loss).calibration(data, num_samples=100)
    assert exact.passed, exact.metrics()
    assert not narrow.passed
    assert narrow.metrics()["coverage_hpd_68"] < 0.68 - 0.1


def test_evaluate_adds_the_calibration_scalars_and_register_records_them(
    held_out, tmp_path: Path
) -> None:
    data, norm = held_out
    artifact = _artifact(ExactHead(norm), norm, {"name": "gaussian_nll"})
    plain = artifact.evaluate(data)
    got = artifact.evaluate(data, calibration={"num_samples": 50, "seed": 2})
    assert got["loss"] == plain["loss"]
    assert got["calibrated"] == 1.0
    assert {"sbc_chi2_pvalue_min", "coverage_hpd_68", "coverage_central_95", "tarp_atc"} <= set(got)
    report = artifact.calibration(data, num_samples=50, seed=2)
    assert {k: got[k] for k in report.metrics()} == report.metrics()

    # any registrable operator carries the record; the metrics are what is checked
    lin = NumpyLinearOp("pipekit_train.core.testing:linear", in_size=D, out_size=2 * D)
    registry = LocalModelRegistry(tmp_path / "registry")
    artifact.model = lin
    artifact.weights_sha256 = TrainingArtifact.hash_weights(lin)
    record = artifact.register(registry, "posterior", test_metrics=got)
    assert record.metrics["test_coverage_hpd_68"] == got["coverage_hpd_68"]
    assert record.metrics["test_calibrated"] == 1.0


def test_a_flow_head_run_is_a_posterior(held_out) -> None:
    """`flow_nll` runs read as `Flow` posteriors in the parameters' units and calibrate."""
    from pipekit_train.core import Flow, losses

    data, norm = held_out
    options = {"flow_layers": 1, "flow_bins": 4, "flow_bound": 3.0}
    width = losses.flow_width(D, 1, 4)
    artifact = _artifact(
        lambda x: np.zeros((len(x), width), np.float32),  # one flow for every x
        norm,
        losses.flow_nll(**options).describe(),
    )
    dist = artifact.posterior().distribution(np.zeros((5, D), np.float32))
    assert isinstance(dist, Flow) and dist.options == options and dist.batch_shape == (5,)
    np.testing.assert_allclose(dist.scale, np.broadcast_to(norm.std["y"], dist.scale.shape))
    report = artifact.calibration(data, num_samples=20)
    assert 0.0 <= report.metrics()["coverage_hpd_68"] <= 1.0


def test_calibration_is_refused_for_a_point_head_before_reading_data(held_out) -> None:
    _, norm = held_out
    artifact = _artifact(ExactHead(norm), norm, {"name": "mse"})
    with pytest.raises(ConfigError, match="gaussian_nll.*mixture_nll.*flow_nll"):
        artifact.calibration(object())  # the head is checked first
    with pytest.raises(ConfigError, match="calibration=3"):
        artifact.evaluate(_simulations(n=30), calibration=3)


def test_too_few_held_out_simulations_are_refused(held_out) -> None:
    _, norm = held_out
    artifact = _artifact(ExactHead(norm), norm, {"name": "gaussian_nll"})
    with pytest.raises(ConfigError, match="num_simulations=10"):
        artifact.evaluate(_simulations(n=10), calibration=True)


# -- the monitor ---------------------------------------------------------------------------


class FakeState:
    """What `CalibrationMonitor` reads of a run: step, plan, normalizer, predict, log."""

    def __init__(self, head: ExactHead, norm: Normalizer) -> None:
        self.step = 0
        self.plan = {"loss": {"name": "gaussian_nll"}}
        self.normalizer = norm
        self.head = head
        self.logged: list[tuple[int, dict[str, float]]] = []

    def predict(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        assert batch["y"].shape == (len(batch["x"]), D)
        return self.head(batch["x"])

    def log(self, metrics: dict[str, float]) -> None:
        self.logged.append((self.step, dict(metrics)))


def test_monitor_logs_every_n_steps_with_a_prefix(held_out) -> None:
    data, norm = held_out
    state = FakeState(ExactHead(norm), norm)
    monitor = CalibrationMonitor(data, every_n_steps=3, num_samples=50)
    monitor.on_train_start(state)
    for step in range(1, 8):
        state.step = step
        monitor.on_step_end(state)
    assert [s for s, _ in state.logged] == [3, 6]
    metrics = state.logged[-1][1]
    assert metrics["cal_calibrated"] == 1.0 and "cal_tarp_atc" in metrics
    assert monitor.last_report is not None
    # the same numbers as the artifact's calibration with the same weights and options
    artifact = _artifact(ExactHead(norm), norm, {"name": "gaussian_nll"})
    expected = artifact.calibration(data, num_samples=50).metrics(prefix="cal_")
    assert metrics == pytest.approx(expected)


def test_monitor_refuses_bad_input_before_training(held_out) -> None:
    data, norm = held_out
    with pytest.raises(ConfigError, match="num_simulations=10"):
        CalibrationMonitor(_simulations(n=10), every_n_steps=5)
    with pytest.raises(ConfigError, match="every_n_steps=0"):
        CalibrationMonitor(data, every_n_steps=0)
    with pytest.raises(ConfigError, match="num_samples=5"):
        CalibrationMonitor(data, every_n_steps=5, num_samples=5)
    with pytest.raises(ConfigError, match=r"x.shape=\(50, 2\), theta.shape=\(40, 2\)"):
        CalibrationMonitor(np.zeros((50, 2)), np.zeros((40, 2)), every_n_steps=5)
    state = FakeState(ExactHead(norm), norm)
    state.plan = {"loss": {"name": "mse"}}
    with pytest.raises(ConfigError, match="Received: loss="):
        CalibrationMonitor(data, every_n_steps=5).on_train_start(state)


def test_run_state_predict_goes_through_the_runs_evaluator() -> None:
    # the numpy reference adapter (mse, linear): predict equals the model's own output
    train, val = regression_task(n_train=64, n_val=32, in_size=3)
    seen: list[np.ndarray] = []

    class Probe:
        def on_step_end(self, state: Any) -> None:
            if state.step == 4:
                x = val.arrays["x"][:5]
                seen.append(state.predict({"x": x, "y": val.arrays["y"][:5]}))

    loop = TrainingLoop(
        model=NumpyLinearOp("pipekit_train.core.testing:linear", in_size=3, out_size=1),
        data=train,
        optimizer_config={"name": "sgd", "lr": 0.05},
        batch_size=16,
        max_steps=4,
        adapter=NumpyAdapter(),
        callbacks=[Probe()],
        progress=False,
    )
    artifact = loop.run()
    np.testing.assert_allclose(seen[0], artifact.model(val.arrays["x"][:5]), rtol=1e-6)


def test_run_state_predict_without_an_evaluator_says_so() -> None:
    from pipekit_train.core.run._state import RunState

    class Ctx:
        predict = None
        backend = "numpy"

    with pytest.raises(NotSupportedError, match="bound no evaluator"):
        RunState(Ctx()).predict({"x": np.zeros((1, 1))})  # type: ignore[arg-type]  # a stand-in
