"""`ModelInputs`: history, forcings and static inputs reach the model the same way on every
path — rollout training (core's loss on numpy), `NeuralForward`, `Cycle` and
`rollout_validation` — and each path equals a hand-written loop over the same model."""

from __future__ import annotations

import numpy as np
import pytest

from pipekit_train.core import Cycle, NeuralForward, rollout_validation
from pipekit_train.core._errors import ConfigError
from pipekit_train.core.data import ModelInputs, Trajectories, TrajectoryWindows
from pipekit_train.core.rollout._train import rollout_loss, rollout_spec

C, F, P = 2, 1, 1  # state channels, forcing channels, static channels
LAYOUT = ModelInputs((C,), history=2, static=(("nu", (P,)),), forcings=(("f", (F,)),))


def _model(seed: int = 0):
    w = np.random.default_rng(seed).normal(0.0, 0.3, size=(LAYOUT.in_channels, C))
    return lambda u: np.tanh(np.asarray(u, np.float64) @ w)


def _data(n: int = 4, length: int = 12, seed: int = 1):
    rng = np.random.default_rng(seed)
    states = rng.normal(size=(n, length, C))
    return Trajectories(
        states,
        static={"nu": rng.uniform(0.1, 1.0, size=(n, P))},
        forcings={"f": rng.normal(size=(n, length, F))},
    )


def test_the_layout_round_trips_and_names_its_blocks() -> None:
    assert ModelInputs.from_json(LAYOUT.to_json()) == LAYOUT
    assert LAYOUT.in_channels == 2 * C + F + P
    assert (LAYOUT.state_channels, LAYOUT.forcing_block, LAYOUT.static_block) == (
        slice(2, 4),
        slice(4, 5),
        slice(5, 6),
    )
    assert ModelInputs((8, 8, 3)).trivial
    u = LAYOUT.assemble(
        np,
        [np.zeros((1, C)), np.ones((1, C))],
        {"nu": np.full((1, P), 7.0)},
        {"f": np.full((1, F), 5.0)},
    )
    np.testing.assert_array_equal(u, [[0, 0, 1, 1, 5, 7]])
    nxt = LAYOUT.advance(np, u, np.full((1, C), 2.0), np.full((1, F), 6.0))
    np.testing.assert_array_equal(nxt, [[1, 1, 2, 2, 6, 7]])


@pytest.mark.parametrize("noise", [False, True])
def test_rollout_loss_with_inputs_is_the_hand_written_unrolled_loop(noise: bool) -> None:
    windows = TrajectoryWindows(_data(), k=3, targets="increments", history=2)
    norm = windows.normalizer()
    batch = norm.apply(windows.get_batch(np.arange(6)))
    model = _model()
    eps = np.random.default_rng(3).normal(0.0, 0.1, batch["x"].shape) if noise else None
    loss, pred = rollout_loss(
        np,
        spec=rollout_spec(norm, True, 1, windows.inputs),
        model_fn=model,
        x=batch["x"],
        y=batch["y"],
        weights=(1.0, 0.5, 1.0),
        backprop="full",
        loss_fn=lambda a, b: np.mean((a - b) ** 2),
        noise=eps,
        forcing=batch["forcing"],
    )
    # by hand: physical input, noise on the two state slots only, forcing per step
    mx, sx = norm.mean["x"], norm.std["x"]
    my, sy = norm.mean["y"], norm.std["y"]
    x = batch["x"] if eps is None else batch["x"] + eps * (np.arange(6) < 2 * C)
    u = x * sx + mx
    truth = (batch["x"] * sx + mx)[:, 2:4]
    prev, cur = u[:, 0:2], u[:, 2:4]
    nu = u[:, 5:6]
    total, preds = 0.0, []
    for j, w in enumerate((1.0, 0.5, 1.0)):
        inp = np.concatenate([prev, cur, batch["forcing"][:, j], nu], axis=-1)
        nxt = cur + (model((inp - mx) / sx) * sy + my)
        truth = truth + (batch["y"][:, j] * sy + my)
        s = (mx[2:4], sx[2:4])
        total += w * np.mean(((nxt - s[0]) / s[1] - (truth - s[0]) / s[1]) ** 2)
        preds.append(((nxt - cur) - my) / sy)
        prev, cur = cur, nxt
    np.testing.assert_allclose(loss, total / 2.5, rtol=1e-12)
    np.testing.assert_allclose(pred, np.stack(preds, axis=1), rtol=1e-10, atol=1e-12)


def test_cycle_with_forcings_and_history_is_the_hand_written_loop() -> None:
    trajs = _data(n=3, length=12)
    norm = TrajectoryWindows(trajs, history=2, targets="increments").normalizer()
    forward = NeuralForward(_model(), norm, residual=True, inputs=LAYOUT)
    whole = trajs.get_batch(np.arange(3))
    states, f, nu = whole["x"], whole["f"], whole["nu"]
    horizon = 8
    per_step = np.swapaxes(f[:, 1 : 1 + horizon], 0, 1)  # (n_steps, n, F): step j from time 1+j
    got = Cycle(forward, horizon, forcings={"f": per_step}, static={"nu": nu}).run(
        states[:, 1], history=states[:, 0][None]
    )
    by_function = Cycle(
        forward, horizon, forcings=lambda j: {"f": f[:, 1 + j]}, static={"nu": nu}
    ).run(states[:, 1], history=states[:, 0][None])
    model, (mx, sx), (my, sy) = (
        _model(),
        (norm.mean["x"], norm.std["x"]),
        (norm.mean["y"], norm.std["y"]),
    )
    prev, cur, want = states[:, 0], states[:, 1], [states[:, 1]]
    for j in range(horizon):
        u = np.concatenate([prev, cur, f[:, 1 + j], nu], axis=-1)
        prev, cur = cur, cur + (model((u - mx) / sx) * sy + my)
        want.append(cur)
    np.testing.assert_allclose(got, np.stack(want), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(by_function, got)
    # one state at a time (no batch axis) gives the same trajectory
    single = Cycle(forward, horizon, forcings={"f": per_step[:, 0]}, static={"nu": nu[0]}).run(
        states[0, 1], history=states[0, :1]
    )
    np.testing.assert_allclose(single, got[:, 0], rtol=1e-12)


def test_a_forced_simulator_runs_in_the_same_loop() -> None:
    def simulator(state, *, forcing):
        return 0.5 * state + forcing["f"]

    out = Cycle(simulator, 3, forcings={"f": np.array([[1.0], [2.0], [3.0]])}).run(np.zeros(1))
    np.testing.assert_array_equal(out[:, 0], [0.0, 1.0, 2.5, 4.25])


def test_rollout_validation_feeds_history_static_and_forcings() -> None:
    trajs = _data(n=2, length=10)
    whole = trajs.get_batch(np.arange(2))

    class Exact:
        """Looks up the stored next state from what the forward is given (a perfect model)."""

        inputs = LAYOUT

        def __call__(self, x, *, history, static, forcing):
            assert history.shape == (len(x), 1, C) and static["nu"].shape == (len(x), P)
            t = np.argmin(np.abs(whole["f"][0, :, 0] - forcing["f"][0, 0]))
            np.testing.assert_allclose(history[:, 0], whole["x"][:, t - 1])
            np.testing.assert_allclose(x, whole["x"][:, t])
            return whole["x"][:, t + 1]

    report = rollout_validation(Exact(), trajs, 8)
    assert report.metrics["val_rollout_nrmse"] == 0.0
    with pytest.raises(ConfigError, match=r"horizon=9"):
        rollout_validation(Exact(), trajs, 9)  # history 1 + 9 steps need 11 states


def test_bad_inputs_are_refused_before_any_step() -> None:
    forward = NeuralForward(_model(), None, residual=True, inputs=LAYOUT)
    x, nu = np.zeros((2, C)), {"nu": np.ones((2, P))}
    with pytest.raises(ConfigError, match=r"forcings\['f'\] with shape \(4, 2, 1\) for n_steps=5"):
        Cycle(forward, 5, forcings={"f": np.zeros((4, 2, F))}, static=nu)
    with pytest.raises(ConfigError, match=r"forced by \['f'\].*forcings=None"):
        Cycle(forward, 5, static=nu)
    with pytest.raises(ConfigError, match=r"static inputs \['nu'\].*keys \[\]"):
        Cycle(forward, 5, forcings={"f": np.zeros((5, 2, F))})
    cycle = Cycle(forward, 5, forcings={"f": np.zeros((5, 2, F))}, static=nu)
    with pytest.raises(ConfigError, match=r"history=2 states.*history=None"):
        cycle.run(x)
    with pytest.raises(ConfigError, match=r"history.*shape \(2, 2, 2\), expected \(1, 2, 2\)"):
        cycle.run(x, history=np.zeros((2, 2, C)))
    with pytest.raises(ConfigError, match=r"inputs with keys \[\]"):
        forward(x, history=x[:, None], forcing={"f": np.zeros((2, F))})
    plain = NeuralForward(lambda u: u, None)
    with pytest.raises(ConfigError, match=r"state alone. Received: history, forcing"):
        plain(x, history=x[:, None], forcing={"f": np.zeros((2, F))})
    with pytest.raises(ConfigError, match=r"state alone.*forcings"):
        Cycle(plain, 3, forcings={"f": np.zeros((3, 1))})
    with pytest.raises(ConfigError, match=r"Cycle\(forward, n_steps, forcings"):
        forward.rollout(x, 3)


def test_the_layout_travels_through_training_and_the_registry(tmp_path) -> None:
    from pipekit_train.core import TrainingLoop
    from pipekit_train.core.registry import LocalModelRegistry
    from pipekit_train.core.testing._numpy_model import NumpyLinearOp

    train = TrajectoryWindows(_data(n=6, length=20), k=1, targets="increments", history=2)
    norm = train.normalizer()
    artifact = TrainingLoop(
        model=NumpyLinearOp(
            "pipekit_train.core.testing:linear", in_size=LAYOUT.in_channels, out_size=C
        ),
        data=train,
        normalizer=norm,
        optimizer_config={"name": "adam", "lr": 0.01},
        batch_size=16,
        max_steps=5,
        progress=False,
    ).run()
    assert artifact.inputs == train.inputs == LAYOUT
    record = artifact.register(LocalModelRegistry(tmp_path), "forced")
    loaded = LocalModelRegistry(tmp_path).load_record_and_model("forced")
    forward = NeuralForward.from_record(*loaded, residual=True)
    assert forward.inputs == LAYOUT and record.version == 1
    x, past = np.ones((3, C)), np.zeros((3, 1, C))
    extras = {"static": {"nu": np.ones((3, P))}, "forcing": {"f": np.ones((3, F))}}
    here = NeuralForward(artifact.model, norm, residual=True, inputs=artifact.inputs)
    np.testing.assert_array_equal(
        forward(x, history=past, **extras), here(x, history=past, **extras)
    )
