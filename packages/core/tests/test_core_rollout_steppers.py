"""Solvers in the rollout: the diverted chain and correction on numpy, refused bad input,
the steppers' names in the plan and its resume key, and `NeuralForward`/`Cycle` with a
coarse stepper."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from pipekit_train.core import (
    ConfigError,
    Cycle,
    NeuralForward,
    NotSupportedError,
    Rollout,
    TrainingLoop,
    TrajectoryWindows,
    losses,
)
from pipekit_train.core.adapter import Capabilities
from pipekit_train.core.rollout import RolloutSpec, rollout_loss, rollout_spec
from pipekit_train.core.testing import (
    NumpyAdapter,
    NumpyLinearOp,
    pendulum_euler,
    periodic_diffusion,
)

D, K, B = 3, 4, 5
DIFFUSION = "pipekit_train.core.testing._golden_rollout:periodic_diffusion"


def damp(state: Any) -> Any:
    """A stepper of this module (importable by name): linear damping."""
    return 0.8 * state


def halve_width(state: Any) -> Any:
    """A stepper that drops a value: refused by the probe."""
    return state[:, :-1]


def broken(state: Any) -> Any:
    raise ValueError("no such state")


class _Norm:
    """A per-feature affine normalizer with `mean`/`std` dicts (what `AffineMap` reads)."""

    def __init__(self, rng: np.random.Generator):
        self.mean = {"x": rng.normal(size=D), "y": rng.normal(size=D) * 0.1}
        self.std = {"x": rng.uniform(0.5, 2.0, D), "y": rng.uniform(0.1, 0.5, D)}

    def apply(self, batch: dict) -> dict:
        return {k: (v - self.mean[k]) / self.std[k] for k, v in batch.items()}

    def invert(self, batch: dict) -> dict:
        return {k: v * self.std[k] + self.mean[k] for k, v in batch.items()}


@pytest.fixture(scope="module")
def case() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    return {
        "norm": _Norm(rng),
        "w": rng.normal(size=(D, D)) * 0.3,
        "x": rng.normal(size=(B, D)),  # normalised first states
        "y": rng.normal(size=(B, K, D)),  # normalised targets
        "noise": 0.05 * rng.normal(size=(B, D)),
    }


def _loss(case: dict, spec: RolloutSpec, weights: tuple, **kw: Any) -> float:
    value, _ = rollout_loss(
        np,
        spec=spec,
        model_fn=lambda u: u @ case["w"],
        x=case["x"],
        y=case["y"],
        weights=weights,
        backprop=kw.pop("backprop", "full"),
        loss_fn=losses.get("mse"),
        **kw,
    )
    return float(value)


@pytest.mark.parametrize("residual", [False, True])
def test_the_diverted_chain_compares_each_step_with_the_stepper_of_the_previous_state(
    case: dict, residual: bool
) -> None:
    norm, w, weights = case["norm"], case["w"], (1.0, 0.5, 2.0, 1.0)
    mx, sx, my, sy = norm.mean["x"], norm.std["x"], norm.mean["y"], norm.std["y"]
    state, total = (case["x"] + case["noise"]) * sx + mx, 0.0
    for i in range(K):  # by hand: trainax's DivertedChainBranchOne, in normalised units
        ref = periodic_diffusion(state)
        pred = (((state - mx) / sx) @ w) * sy + my
        nxt = state + pred if residual else pred
        total += weights[i] * np.mean(((nxt - mx) / sx - (ref - mx) / sx) ** 2)
        state = nxt
    spec = rollout_spec(norm, residual, 1)
    got = _loss(case, spec, weights, noise=case["noise"], reference=periodic_diffusion)
    assert got == pytest.approx(total / sum(weights), rel=1e-12)
    # the targets are not read: another trajectory gives the same loss
    other = dict(case, y=case["y"] + 1.0)
    assert _loss(other, spec, weights, noise=case["noise"], reference=periodic_diffusion) == got
    assert _loss(case, spec, weights, noise=case["noise"]) != pytest.approx(got)


def test_cut_div_chain_stops_the_gradient_of_the_reference_only(case: dict) -> None:
    spec = rollout_spec(case["norm"], True, 1)
    for cut, backprop, expected in ((False, "full", 0), (True, "full", K), (True, 2, K + 1)):
        stopped: list[tuple[int, ...]] = []

        def detach(a: Any, seen: list = stopped) -> Any:
            seen.append(a.shape)
            return a

        _loss(
            case,
            spec,
            (1.0,) * K,
            backprop=backprop,
            detach=detach,
            reference=damp,
            cut_div_chain=cut,
        )
        assert len(stopped) == expected, (cut, backprop)  # cut BPTT: one more, at step 2


@pytest.mark.parametrize(
    ("correction", "residual"), [("parallel", True), ("sequential", False), ("sequential", True)]
)
def test_a_corrected_step_is_the_coarse_step_plus_the_model(
    case: dict, correction: str, residual: bool
) -> None:
    norm, w = case["norm"], case["w"]
    mx, sx, my, sy = norm.mean["x"], norm.std["x"], norm.mean["y"], norm.std["y"]
    weights = (1.0,) * K
    state = case["x"] * sx + mx
    truth, total = state, 0.0
    for i in range(K):  # apebench's CorrectedStepper, targets from the stored trajectory
        target = case["y"][:, i] * sy + my
        truth = truth + target if residual else target
        c = periodic_diffusion(state)
        u = state if correction == "parallel" else c
        pred = (((u - mx) / sx) @ w) * sy + my
        nxt = c + pred if residual else pred
        total += np.mean(((nxt - mx) / sx - (truth - mx) / sx) ** 2)
        state = nxt
    spec = rollout_spec(norm, residual, 1, coarse_stepper=periodic_diffusion, correction=correction)
    assert _loss(case, spec, weights) == pytest.approx(total / K, rel=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"target": "diverted"}, r"Received: target='diverted', ref_stepper=None\. Pass"),
        ({"target": "div"}, r"`target` must be one of.*Received: target='div'"),
        ({"target": "diverted", "ref_stepper": 3}, r"`ref_stepper` must be a callable.*=3"),
        (
            {"target": "diverted", "ref_stepper": lambda s: s},
            r"`ref_stepper` must be importable by name.*module-level function",
        ),
        (
            {"target": "diverted", "ref_stepper": "no_such_module_here:step"},
            r"`ref_stepper` names a module that cannot be imported",
        ),
        ({"ref_stepper": damp}, r"`ref_stepper` is for the diverted chain.*target='diverted'"),
        ({"cut_div_chain": True}, r"`cut_div_chain` is for the diverted chain"),
        ({"correction": "parallel", "residual": True}, r"coarse_stepper=None\)\. Pass"),
        ({"coarse_stepper": damp}, r"correction=None\)\. Pass correction='parallel'"),
        ({"coarse_stepper": damp, "correction": "parallel"}, r"residual=False\)\. Use residual"),
        ({"coarse_stepper": damp, "correction": "both"}, r"Received: correction='both'"),
        ({"coarse_stepper": [1], "correction": "sequential"}, r"`coarse_stepper` must be a"),
    ],
)
def test_bad_steppers_are_refused_naming_field_value_and_fix(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Rollout(steps=2, **kwargs)


def test_the_plan_and_resume_key_name_the_steppers() -> None:
    plain = Rollout(steps=2)
    assert set(plain.to_json()) == {
        "steps",
        "weights",
        "backprop",
        "noise_std",
        "schedule",
        "residual",
        "gradient_checkpointing",
    }  # a rollout without steppers keeps its JSON (and old checkpoints their key)
    spec = Rollout(
        steps=2,
        residual=True,
        target="diverted",
        ref_stepper=DIFFUSION,
        coarse_stepper=damp,
        correction="parallel",
    )
    data = json.loads(json.dumps(spec.to_json()))
    assert data["ref_stepper"] == DIFFUSION and data["cut_div_chain"] is False
    assert data["coarse_stepper"] == f"{__name__}:damp" and data["correction"] == "parallel"
    assert spec.ref_stepper is periodic_diffusion  # the import string resolved
    back = Rollout.from_json(data)
    assert back == spec and hash(back) == hash(spec) and back.to_json() == spec.to_json()
    key = spec.resume_json()
    assert key["ref_stepper"] == DIFFUSION and key["coarse_stepper"] == data["coarse_stepper"]
    other = Rollout(steps=2, residual=True, target="diverted", ref_stepper=damp)
    assert other.resume_json() != key
    assert Rollout(steps=2, target="diverted", ref_stepper=damp).resume_json() != (
        Rollout(steps=2, target="diverted", ref_stepper=damp, cut_div_chain=True).resume_json()
    )
    with pytest.raises(ConfigError, match="`coarse_stepper` names an attribute"):
        Rollout.from_json({**data, "coarse_stepper": f"{__name__}:gone"})


class _Stepping(NumpyAdapter):
    """The numpy adapter declaring rollout steppers and probing them on numpy zeros."""

    capabilities = Capabilities(rollout=True, rollout_steppers=True)

    def stepper_shape(self, stepper: Any, state_shape: tuple, dtype: Any = np.float32) -> Any:
        return np.shape(stepper(np.zeros(state_shape, dtype)))


@pytest.fixture(scope="module")
def windows() -> TrajectoryWindows:
    states = np.random.default_rng(1).normal(size=(3, 12, D)).astype(np.float32)
    return TrajectoryWindows(states, k=K, targets="increments")


def _loop(data: Any, rollout: Rollout, adapter: Any, **kw: Any) -> TrainingLoop:
    return TrainingLoop(
        NumpyLinearOp("pipekit_train.core.testing:linear", in_size=D, out_size=D),
        data,
        rollout=rollout,
        adapter=adapter,
        max_steps=2,
        batch_size=4,
        progress=False,
        **kw,
    )


def test_a_stepper_that_changes_the_shape_is_refused_before_any_work(
    windows: TrajectoryWindows, tmp_path: Any
) -> None:
    ck = tmp_path / "ck"
    bad = Rollout(steps=K, residual=True, target="diverted", ref_stepper=halve_width)
    with pytest.raises(ConfigError, match=r"`ref_stepper` must return.*\(2, 3\) to shape \(2, 2\)"):
        _loop(windows, bad, _Stepping(), checkpoint=str(ck))
    assert not ck.exists()
    failing = Rollout(steps=K, residual=True, coarse_stepper=broken, correction="parallel")
    with pytest.raises(ConfigError, match=r"`coarse_stepper` .*broken\) failed.*no such state"):
        _loop(windows, failing, _Stepping())
    good = Rollout(steps=K, residual=True, target="diverted", ref_stepper=periodic_diffusion)
    assert _loop(windows, good, _Stepping()).plan.rollout is good
    with pytest.raises(NotSupportedError, match=r"A solver in the rollout.*ref_stepper=\.\.\."):
        _loop(
            windows,
            good,
            type("R", (NumpyAdapter,), {"capabilities": Capabilities(rollout=True)})(),
        )


def test_a_stepper_with_model_inputs_is_refused() -> None:
    states = np.random.default_rng(2).normal(size=(3, 12, D)).astype(np.float32)
    history = TrajectoryWindows(states, k=K, targets="increments", history=2)
    rollout = Rollout(steps=K, residual=True, target="diverted", ref_stepper=damp)
    with pytest.raises(ConfigError, match=r"advances the state alone.*history"):
        _loop(history, rollout, _Stepping())


class _Linear:
    """A numpy model operator `u -> u @ w` (no device rollout: the host path)."""

    def __init__(self, w: np.ndarray):
        self.w = w

    def __call__(self, u: np.ndarray) -> np.ndarray:
        return u @ self.w


def test_neural_forward_and_cycle_step_with_the_coarse_stepper() -> None:
    w = np.array([[0.1, -0.2], [0.05, 0.1]])
    forward = NeuralForward(
        _Linear(w), residual=True, coarse_stepper=pendulum_euler, correction="parallel"
    )
    x0 = np.array([[1.0, 0.0], [0.5, -0.3]])
    by_hand = [x0]
    for _ in range(5):
        by_hand.append(pendulum_euler(by_hand[-1]) + by_hand[-1] @ w)
    trajectory = Cycle(forward, n_steps=5).run(x0)
    np.testing.assert_allclose(trajectory, np.stack(by_hand), rtol=1e-12)
    np.testing.assert_allclose(forward.rollout(x0, 5), trajectory, rtol=1e-12)
    np.testing.assert_allclose(forward(x0[0]), by_hand[1][0], rtol=1e-12)
    sequential = NeuralForward(_Linear(w), coarse_stepper=pendulum_euler, correction="sequential")
    np.testing.assert_allclose(sequential(x0), pendulum_euler(x0) @ w, rtol=1e-12)
    config = forward.get_config()
    assert config["coarse_stepper"].endswith("_golden_rollout:pendulum_euler")
    assert config["correction"] == "parallel"
    with pytest.raises(ConfigError, match=r"correction=None\)\. Pass correction="):
        NeuralForward(_Linear(w), residual=True, coarse_stepper=pendulum_euler)
    with pytest.raises(ConfigError, match=r"point prediction.*head='gaussian'"):
        NeuralForward(
            _Linear(w),
            residual=True,
            head="gaussian",
            coarse_stepper=pendulum_euler,
            correction="parallel",
        )
    shrink = NeuralForward(_Linear(w), coarse_stepper=halve_width, correction="sequential")
    with pytest.raises(ConfigError, match=r"`coarse_stepper` must return"):
        shrink(x0)


def test_an_artifact_of_a_corrected_run_rolls_out_and_scores_with_its_stepper() -> None:
    from pipekit_train.core import rollout_validation
    from pipekit_train.core.artifact._rollout_evaluation import (
        artifact_rollout,
        rollout_window_loss,
    )
    from pipekit_train.core.data import Trajectories

    states = np.random.default_rng(3).normal(size=(2, 9, D))
    model = _Linear(np.random.default_rng(4).normal(size=(D, D)) * 0.1)
    rollout = Rollout(
        steps=2, residual=True, coarse_stepper=periodic_diffusion, correction="parallel"
    )
    plan = {"rollout": json.loads(json.dumps(rollout.to_json())), "loss": "mse"}
    report = artifact_rollout(model, None, plan, Trajectories(states), 6)
    corrected = NeuralForward(
        model, residual=True, coarse_stepper=periodic_diffusion, correction="parallel"
    )
    want = rollout_validation(corrected, Trajectories(states), 6, prefix="rollout_")
    assert report.metrics == pytest.approx(want.metrics, rel=1e-5)
    plain = rollout_validation(NeuralForward(model, residual=True), states, 6, prefix="rollout_")
    assert report.metrics != pytest.approx(plain.metrics, rel=1e-3)
    windows = TrajectoryWindows(states, k=2, targets="increments")
    got = rollout_window_loss(
        model, windows, plan, loss="mse", metrics=None, batch_size=64, normalizer=None
    )
    batch = windows.get_batch(np.arange(len(windows)))
    value, _ = rollout_loss(
        np,
        spec=rollout_spec(None, True, 1, coarse_stepper=periodic_diffusion, correction="parallel"),
        model_fn=model,
        x=batch["x"],
        y=batch["y"],
        weights=(1.0, 1.0),
        backprop="full",
        loss_fn=losses.get("mse"),
    )
    assert got is not None and got["loss"] == pytest.approx(float(value), rel=1e-5)


@pytest.mark.parametrize("steps", [1, 2])
def test_a_rollout_monitor_rolls_a_corrected_run_out_with_its_stepper(steps: int) -> None:
    from pipekit_train.core import RolloutMonitor, rollout_validation

    states = np.random.default_rng(5).normal(size=(3, 8, D))
    model = _Linear(np.random.default_rng(6).normal(size=(D, D)) * 0.1)
    rollout = Rollout(
        steps=steps, residual=True, coarse_stepper=periodic_diffusion, correction="parallel"
    )
    spec = rollout_spec(None, True, 1, coarse_stepper=periodic_diffusion, correction="parallel")

    class _State:  # what the monitor reads of a run
        plan = {"rollout": json.loads(json.dumps(rollout.to_json())), "loss": "mse"}
        normalizer = None

        @staticmethod
        def predict(batch: dict) -> np.ndarray:
            if steps > 1:  # pairs of a longer rollout: one model application
                return model(batch["x"])
            return rollout_loss(  # k = 1: the backend rolls pairs out (evaluates_as_rollout)
                np,
                spec=spec,
                model_fn=model,
                x=batch["x"],
                y=batch["y"],
                weights=(1.0,),
                backprop="full",
                loss_fn=losses.get("mse"),
            )[1]

    monitor = RolloutMonitor(states, 5, residual=True)
    got = monitor.validation_metrics(_State())
    corrected = NeuralForward(
        model, residual=True, coarse_stepper=periodic_diffusion, correction="parallel"
    )
    want = rollout_validation(corrected, states, 5).metrics
    assert got == pytest.approx(want, rel=1e-5)
