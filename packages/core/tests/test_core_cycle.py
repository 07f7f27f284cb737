"""`NeuralForward` and `Cycle`: emulator as forward operator, rollouts, hooks, divergence."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipekit_train.core._errors import ConfigError, IntegrityError, PipekitError
from pipekit_train.core.registry import LocalModelRegistry
from pipekit_train.core.rollout._cycle import Cycle, NeuralForward, NonFiniteStateError
from pipekit_train.core.testing._numpy_model import NumpyLinearOp

FACTORY = "pipekit_train.core.testing._numpy_model:linear"


class DampedOscillator:
    """x'' + 2 zeta omega x' + omega^2 x = 0, state (x, v), semi-implicit Euler steps."""

    def __init__(self, omega: float = 2.0, zeta: float = 0.1, dt: float = 0.05):
        self.omega, self.zeta, self.dt = omega, zeta, dt

    def __call__(self, state: np.ndarray) -> np.ndarray:
        s = np.asarray(state, dtype=np.float64)
        x, v = s[..., 0], s[..., 1]
        v_new = v + self.dt * (-(self.omega**2) * x - 2 * self.zeta * self.omega * v)
        x_new = x + self.dt * v_new
        return np.stack([x_new, v_new], axis=-1)


class MeanStdNormalizer:
    """A stand-in for `pipekit_train.core.data.Normalizer`: per-key (x - mean) / std."""

    def __init__(self, stats: dict[str, dict[str, list[float]]]):
        self.stats = {k: {m: np.asarray(v) for m, v in s.items()} for k, s in stats.items()}

    @classmethod
    def fit(cls, batch: dict[str, np.ndarray]) -> MeanStdNormalizer:
        return cls(
            {k: {"mean": v.mean(0).tolist(), "std": v.std(0).tolist()} for k, v in batch.items()}
        )

    def apply(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: (v - self.stats[k]["mean"]) / self.stats[k]["std"] for k, v in batch.items()}

    def invert(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: v * self.stats[k]["std"] + self.stats[k]["mean"] for k, v in batch.items()}

    def to_json(self) -> dict[str, Any]:
        return {k: {m: a.tolist() for m, a in s.items()} for k, s in self.stats.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MeanStdNormalizer:
        return cls(data)


def simulate_pairs(
    sim: DampedOscillator, n: int = 256, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(seed).uniform(-2, 2, size=(n, 2))
    return x, sim(x)


def fit_linear_op(x: np.ndarray, y: np.ndarray) -> NumpyLinearOp:
    """'Train' the emulator: least squares for W and b (the dynamics are linear)."""
    design = np.hstack([x, np.ones((len(x), 1))])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    op = NumpyLinearOp(FACTORY, seed=0, in_size=x.shape[1], out_size=y.shape[1])
    op.model = op.model.replace(W=coef[:-1].astype(np.float32), b=coef[-1].astype(np.float32))
    return op


def test_cycle_rollout_of_the_simulator() -> None:
    sim = DampedOscillator()
    x0 = np.array([1.0, 0.0])
    traj = Cycle(sim, n_steps=50).run(x0)
    assert traj.shape == (51, 2) and traj.dtype == np.float64
    np.testing.assert_array_equal(traj[0], x0)
    state = x0
    for k in range(1, 51):
        state = sim(state)
        np.testing.assert_array_equal(traj[k], state)
    energy = traj[:, 0] ** 2 * sim.omega**2 + traj[:, 1] ** 2
    assert energy[-1] < energy[0]  # damped


def test_cycle_does_not_alias_its_input_or_trajectory() -> None:
    def in_place(state: np.ndarray) -> np.ndarray:
        state *= 2.0
        return state

    x0 = np.array([1.0, 1.0])
    traj = Cycle(in_place, n_steps=3).run(x0)
    np.testing.assert_array_equal(x0, [1.0, 1.0])
    np.testing.assert_array_equal(traj[:, 0], [1.0, 2.0, 4.0, 8.0])


def test_cycle_promotes_integer_states_and_keeps_batches() -> None:
    traj = Cycle(lambda s: s + 1, n_steps=2).run(np.zeros((3, 2), dtype=np.int64))
    assert traj.dtype == np.float64 and traj.shape == (3, 3, 2)
    np.testing.assert_array_equal(traj[2], np.full((3, 2), 2.0))


@pytest.mark.parametrize("as_string", [False, True])
def test_emulator_handoff_with_the_core_normalizer_through_the_registry(
    tmp_path: Path, as_string: bool
) -> None:
    """Simulate -> fit an emulator on normalised data -> register (with the normalizer)
    -> load -> NeuralForward -> Cycle rollout agrees with the simulator's rollout."""
    from pipekit_train.core.data._normalizer import Normalizer

    sim = DampedOscillator()
    x, y = simulate_pairs(sim)
    norm = Normalizer({"x": x.mean(0), "y": y.mean(0)}, {"x": x.std(0), "y": y.std(0)})
    scaled = norm.apply({"x": x, "y": y})
    op = fit_linear_op(scaled["x"], scaled["y"])

    registry = LocalModelRegistry(tmp_path / "models")
    # TrainingArtifact.register passes `normalizer.to_json()` (a string)
    registry.register("oscillator", op, normalizer=norm.to_json() if as_string else norm)
    record, loaded = registry.load_record_and_model("oscillator")
    assert record.normalizer == norm.to_dict()
    restored = record.load_normalizer()
    assert restored == norm
    forward = NeuralForward(loaded, normalizer=restored)

    x0 = np.array([1.5, -0.5])
    reference = Cycle(sim, n_steps=40).run(x0)
    emulated = Cycle(forward, n_steps=40).run(x0)
    np.testing.assert_allclose(emulated, reference, atol=1e-4)

    batch = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.5]])
    np.testing.assert_allclose(forward(batch), sim(batch), atol=1e-5)
    assert forward(batch[0]).shape == (2,)
    config = forward.get_config()
    assert config["model"] == loaded.get_config() and config["normalizer"] == norm.to_dict()


def test_neural_forward_accepts_any_apply_invert_normalizer() -> None:
    sim = DampedOscillator()
    x, y = simulate_pairs(sim, seed=2)
    norm = MeanStdNormalizer.fit({"x": x, "y": y})
    scaled = norm.apply({"x": x, "y": y})
    forward = NeuralForward(fit_linear_op(scaled["x"], scaled["y"]), normalizer=norm)
    x0 = np.array([-1.0, 0.25])
    np.testing.assert_allclose(
        Cycle(forward, n_steps=20).run(x0), Cycle(sim, n_steps=20).run(x0), atol=1e-4
    )
    assert forward.get_config()["normalizer"] == norm.to_json()


def test_neural_forward_uses_x_for_inputs_and_y_for_outputs() -> None:
    calls: list[tuple[str, tuple[str, ...]]] = []

    class Recorder:
        def apply(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            calls.append(("apply", tuple(batch)))
            return {k: v * 10 for k, v in batch.items()}

        def invert(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            calls.append(("invert", tuple(batch)))
            return {k: v + 1 for k, v in batch.items()}

    forward = NeuralForward(lambda a: a * 2, normalizer=Recorder())
    np.testing.assert_array_equal(forward(np.array([1.0, 2.0])), [21.0, 41.0])
    assert calls == [("apply", ("x",)), ("invert", ("y",))]
    custom = NeuralForward(lambda a: a, normalizer=Recorder(), state_key="u", output_key="du")
    custom(np.ones((2, 2)))
    assert calls[-2:] == [("apply", ("u",)), ("invert", ("du",))]


def test_neural_forward_residual_predicts_the_increment() -> None:
    sim = DampedOscillator()
    x, y = simulate_pairs(sim, seed=1)
    op = fit_linear_op(x, y - x)
    forward = NeuralForward(op, residual=True)
    x0 = np.array([0.3, 0.7])
    np.testing.assert_allclose(
        Cycle(forward, n_steps=30).run(x0), Cycle(sim, n_steps=30).run(x0), atol=1e-4
    )
    # without the residual flag the same model is a different (wrong) forward operator
    assert not np.allclose(NeuralForward(op)(x0), sim(x0), atol=1e-3)


def test_neural_forward_validation() -> None:
    op = NumpyLinearOp(FACTORY, in_size=2, out_size=3)
    with pytest.raises(ConfigError, match="`model_op` must be a callable"):
        NeuralForward(object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="`normalizer` must have `apply"):
        NeuralForward(op, normalizer={"mean": 0})
    with pytest.raises(ConfigError, match="`residual` must be a bool"):
        NeuralForward(op, residual=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="`state_key`"):
        NeuralForward(op, state_key="")
    with pytest.raises(ConfigError, match=r"state.shape=\(1, 1, 2\)"):
        NeuralForward(op)(np.zeros((1, 1, 2)))
    with pytest.raises(ConfigError, match="out_size == in_size"):
        NeuralForward(op, residual=True)(np.zeros(2))


def test_hook_replaces_or_keeps_the_state() -> None:
    seen: list[int] = []
    observations = {3: np.array([0.0, 0.0])}

    def assimilate(step: int, state: np.ndarray) -> np.ndarray | None:
        seen.append(step)
        if step in observations:
            return state + 0.5 * (observations[step] - state)  # nudge halfway to the obs
        return None

    sim = DampedOscillator()
    x0 = np.array([1.0, 0.0])
    traj = Cycle(sim, n_steps=5, hook=assimilate).run(x0)
    assert seen == [1, 2, 3, 4, 5]
    plain = Cycle(sim, n_steps=5).run(x0)
    np.testing.assert_array_equal(traj[:3], plain[:3])
    np.testing.assert_allclose(traj[3], 0.5 * sim(plain[2]))
    np.testing.assert_allclose(traj[4], sim(traj[3]))


def test_hook_with_wrong_shape_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"`hook` must return a state.*step 1"):
        Cycle(lambda s: s, n_steps=2, hook=lambda k, s: s[:1]).run(np.zeros(2))
    with pytest.raises(ConfigError, match=r"`forward` must return a state.*step 1"):
        Cycle(lambda s: np.zeros(3), n_steps=2).run(np.zeros(2))


def test_non_finite_state_names_the_step() -> None:
    with (
        np.errstate(over="ignore"),
        pytest.raises(NonFiniteStateError, match=r"step 4 \(after `forward`\)") as info,
    ):
        Cycle(lambda s: s * 1e100, n_steps=10).run(np.ones(2))
    assert isinstance(info.value, PipekitError) and isinstance(info.value, FloatingPointError)
    with pytest.raises(NonFiniteStateError, match=r"step 2 \(after `hook`\)"):
        Cycle(lambda s: s, n_steps=3, hook=lambda k, s: s * np.nan if k == 2 else None).run(
            np.ones(2)
        )
    with pytest.raises(ConfigError, match="initial `state` must be finite"):
        Cycle(lambda s: s, n_steps=1).run(np.array([np.inf, 0.0]))


@pytest.mark.parametrize("n_steps", [0, -3, True, 2.5, "10", None])
def test_n_steps_must_be_a_positive_int(n_steps: object) -> None:
    with pytest.raises(ConfigError, match=f"Received: n_steps={n_steps!r}"):
        Cycle(lambda s: s, n_steps=n_steps)  # type: ignore[arg-type]


def test_cycle_validation_and_config() -> None:
    with pytest.raises(ConfigError, match="`forward` must be a callable"):
        Cycle(3, n_steps=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="`hook` must be a callable"):
        Cycle(lambda s: s, n_steps=1, hook="assimilate")  # type: ignore[arg-type]
    config = Cycle(DampedOscillator(), n_steps=np.int64(7)).get_config()
    assert config["n_steps"] == 7 and config["hook"] is None
    assert config["type"] == "pipekit_train.core.rollout._cycle:Cycle"
    assert config["forward"].endswith(":DampedOscillator")
    op = NumpyLinearOp(FACTORY, in_size=2, out_size=2)
    assert Cycle(NeuralForward(op), n_steps=2).get_config()["forward"]["model"] == op.get_config()


# -- the Gaussian head ------------------------------------------------------------------


def gaussian_op(in_size: int = 2, k: int = 2, seed: int = 0) -> NumpyLinearOp:
    """A linear model with 2k outputs: a mean and a log-variance per target value."""
    rng = np.random.default_rng(seed)
    op = NumpyLinearOp(FACTORY, seed=0, in_size=in_size, out_size=2 * k)
    op.model = op.model.replace(
        W=rng.normal(size=(in_size, 2 * k)).astype(np.float32),
        b=rng.normal(size=2 * k).astype(np.float32),
    )
    return op


def gaussian_normalizer() -> Any:
    from pipekit_train.core.data import Normalizer

    return Normalizer({"x": [1.0, -2.0], "y": [100.0, -0.5]}, {"x": [2.0, 0.5], "y": [10.0, 0.01]})


def test_gaussian_head_returns_mean_and_std_in_original_units() -> None:
    op, norm = gaussian_op(), gaussian_normalizer()
    forward = NeuralForward(op, normalizer=norm, head="gaussian")
    states = np.array([[1.0, -2.0], [3.0, 0.0], [-1.0, -2.5]], dtype=np.float32)
    dist = forward.distribution(states)

    raw = op((states - [1.0, -2.0]) / np.array([2.0, 0.5], np.float32))
    expected_mean = raw[:, :2] * np.array([10.0, 0.01]) + [100.0, -0.5]
    expected_std = np.exp(0.5 * raw[:, 2:].astype(np.float64)) * [10.0, 0.01]
    np.testing.assert_allclose(dist.mean, expected_mean, rtol=1e-5)
    np.testing.assert_allclose(dist.std, expected_std, rtol=1e-5)
    assert dist.mean.shape == dist.std.shape == (3, 2)
    # calling the forward gives the mean, so it drives a Cycle unchanged
    np.testing.assert_array_equal(forward(states), dist.mean)
    # one state in, one distribution out
    single = forward.distribution(states[1])
    np.testing.assert_allclose(single.mean, dist.mean[1], rtol=1e-6)
    np.testing.assert_allclose(single.std, dist.std[1], rtol=1e-6)
    low, high = dist.interval(0.95)
    np.testing.assert_allclose(high - dist.mean, 1.959964 * dist.std, rtol=1e-6)
    np.testing.assert_allclose(dist.mean - low, high - dist.mean)
    np.testing.assert_allclose(dist.z_score(dist.mean + 2 * dist.std), 2.0)
    # residual: the mean moves by the state, the spread does not
    res = NeuralForward(op, residual=True, head="gaussian").distribution(states)
    plain = NeuralForward(op, head="gaussian").distribution(states)
    np.testing.assert_allclose(res.mean, plain.mean + states, rtol=1e-6)
    np.testing.assert_array_equal(res.std, plain.std)


def test_gaussian_samples_match_the_predicted_spread() -> None:
    from pipekit_train.core import Gaussian

    dist = Gaussian(np.array([1.0, -3.0]), np.array([0.5, 2.0]))
    draws = dist.sample(np.random.default_rng(0), n=20000)
    assert draws.shape == (20000, 2)
    np.testing.assert_allclose(draws.mean(0), dist.mean, atol=0.05)
    np.testing.assert_allclose(draws.std(0), dist.std, rtol=0.03)
    inside = np.mean((draws > dist.interval(0.68)[0]) & (draws < dist.interval(0.68)[1]), axis=0)
    np.testing.assert_allclose(inside, 0.68, atol=0.015)
    np.testing.assert_allclose(
        dist.log_prob(dist.mean), -np.log(dist.std) - 0.5 * np.log(2 * np.pi)
    )
    with pytest.raises(ConfigError, match=r"Received: level=95"):
        dist.interval(95)


def test_gaussian_head_validation() -> None:
    with pytest.raises(
        ConfigError,
        match=r"`head` must be one of \['point', 'gaussian', 'mixture', 'flow', 'generative'\]",
    ):
        NeuralForward(gaussian_op(), head="laplace")
    with pytest.raises(
        ConfigError, match=r"needs a Gaussian, mixture or flow head. Received: head='point'"
    ):
        NeuralForward(gaussian_op()).distribution(np.zeros(2))
    odd = NumpyLinearOp(FACTORY, in_size=2, out_size=3)
    with pytest.raises(ConfigError, match=r"even-sized last axis\). Received: output shape \(3,\)"):
        NeuralForward(odd, head="gaussian")(np.zeros(2))
    assert NeuralForward(gaussian_op(), head="gaussian").get_config()["head"] == "gaussian"


def test_gaussian_head_travels_through_the_registry(tmp_path: Path) -> None:
    op, norm = gaussian_op(), gaussian_normalizer()
    registry = LocalModelRegistry(tmp_path / "models")
    with pytest.raises(ConfigError, match="Received: head='gauss'"):
        registry.register("posterior", op, normalizer=norm, head="gauss")
    assert registry.versions("posterior") == []  # nothing written
    record = registry.register("posterior", op, normalizer=norm, head="gaussian")
    registry.register("plain", op, normalizer=norm)

    loaded_record, loaded = registry.load_record_and_model("posterior")
    assert loaded_record.head == "gaussian"
    forward = NeuralForward.from_record(loaded_record, loaded)
    assert forward.head == "gaussian" and forward.normalizer == norm
    states = np.array([[0.5, -1.0], [2.0, -2.0]], dtype=np.float32)
    expected = NeuralForward(op, normalizer=norm, head="gaussian").distribution(states)
    got = forward.distribution(states)
    np.testing.assert_array_equal(got.mean, expected.mean)
    np.testing.assert_array_equal(got.std, expected.std)

    # a record without a head is a point predictor, and its manifest has no `head` key
    plain_record, plain_op = registry.load_record_and_model("plain")
    assert (
        plain_record.head is None
        and NeuralForward.from_record(plain_record, plain_op).head == "point"
    )
    plain_manifest = json.loads((tmp_path / "models/plain/1/manifest.json").read_text())
    assert "head" not in plain_manifest

    # the head is covered by the record digest
    path = tmp_path / "models/posterior/1/manifest.json"
    manifest = json.loads(path.read_text())
    assert manifest["head"] == "gaussian" and manifest["record_sha256"] == record.record_sha256
    manifest["head"] = "point"
    path.write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError, match="does not match its digest"):
        registry.load("posterior")


def test_neural_forward_rolls_out_fields_with_state_ndim_3() -> None:
    """`state_ndim=3`: one (H, W, C) field or a batch (n, H, W, C), per-channel statistics."""
    from pipekit_train.core.data import Normalizer

    def model(batch: np.ndarray) -> np.ndarray:  # a normalised increment: half a cell's value
        assert batch.ndim == 4
        return 0.5 * batch

    norm = Normalizer(
        {"x": np.array([1.0, 0.0]), "y": np.array([0.0, 0.0])},
        {"x": np.array([2.0, 1.0]), "y": np.array([0.1, 0.1])},
    )
    forward = NeuralForward(model, normalizer=norm, residual=True, state_ndim=3)
    field = np.random.default_rng(0).standard_normal((4, 5, 2))
    expected = field + 0.1 * 0.5 * (field - [1.0, 0.0]) / [2.0, 1.0]
    np.testing.assert_allclose(forward(field), expected)
    np.testing.assert_allclose(forward(np.stack([field, field]))[1], expected)
    trajectory = Cycle(forward, 3).run(np.stack([field, 2 * field]))
    assert trajectory.shape == (4, 2, 4, 5, 2)
    assert forward.get_config()["state_ndim"] == 3
    assert "state_ndim" not in NeuralForward(model).get_config()
    with pytest.raises(ConfigError, match=r"one state \(3-D\) or a batch of states \(4-D\)"):
        forward(np.zeros((4, 2)))
    with pytest.raises(ConfigError, match=r"state_ndim=3"):
        NeuralForward(model)(field)  # a field on a vector forward: the fix is named
    with pytest.raises(ConfigError, match=r"Received: state_ndim=0"):
        NeuralForward(model, state_ndim=0)
