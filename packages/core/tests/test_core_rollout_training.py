"""`Rollout`: bad settings are refused before any work; `rollout_loss` on numpy."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipekit_train.core import (
    ArrayDataset,
    ConfigError,
    NeuralForward,
    NotSupportedError,
    Rollout,
    RolloutSchedule,
    TrainingLoop,
    TrajectoryWindows,
    losses,
)
from pipekit_train.core.adapter import Capabilities
from pipekit_train.core.rollout import rollout_loss, rollout_spec
from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp


def _windows(k: int = 4, targets: str = "states") -> TrajectoryWindows:
    states = np.random.default_rng(0).normal(size=(4, 20, 3)).astype(np.float32)
    return TrajectoryWindows(states, k=k, targets=targets)  # type: ignore[arg-type]


def _loop(data: object, rollout: object, **kw: object) -> TrainingLoop:
    kw.setdefault("adapter", NumpyAdapter())
    return TrainingLoop(
        NumpyLinearOp("pipekit_train.core.testing:linear", in_size=3, out_size=3),
        data,
        rollout=rollout,  # type: ignore[arg-type]
        max_steps=2,
        batch_size=4,
        progress=False,
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"steps": 0}, r"Received: steps=0\. Use steps=1"),
        (
            {"steps": 3, "weights": (1.0, 2.0)},
            r"Received: weights=\(1\.0, 2\.0\) for steps=3\. Pass 3",
        ),
        ({"steps": 2, "weights": (0.0, 0.0)}, r"not all zero\. Received: weights"),
        ({"backprop": "some"}, r"Received: backprop='some'"),
        ({"backprop": 0}, r"Received: backprop=0"),
        ({"noise_std": -1.0}, r"Received: noise_std=-1\.0"),
        ({"steps": 4, "schedule": {0: 2, 10: 1}}, r"monotone.*k=2 from update 0, then k=1"),
        ({"steps": 4, "schedule": {5: 2}}, r"from the first update \(a key 0\)"),
        ({"steps": 2, "schedule": {0: 1, 10: 4}}, r"reaches k=4, longer than steps=2.*steps=4"),
        ({"steps": 2, "schedule": RolloutSchedule(1, 10, 3)}, r"reaches k=3"),
        ({"gradient_checkpointing": 1}, r"Received: gradient_checkpointing=1\. Use True"),
        ({"reduction": "max"}, r"\['mean', 'sum'\]\. Received: reduction='max'\. Use 'mean'"),
    ],
)
def test_bad_fields_name_the_field_value_and_fix(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Rollout(**kwargs)


def test_schedule_is_a_pure_function_of_the_update_and_json_round_trips() -> None:
    r = Rollout(steps=4, schedule=RolloutSchedule(start=1, every_n_steps=10, maximum=4))
    assert [r.steps_at(n) for n in (0, 9, 10, 29, 30, 10**6)] == [1, 1, 2, 3, 4, 4]
    assert r.max_steps == 4
    for spec in (
        r,
        Rollout(steps=3, weights=(1, 2, 3), backprop=2, schedule={0: 1, 7: 3}),
        Rollout(steps=2, gradient_checkpointing=True),
        Rollout(steps=3, weights=(1, 0.5, 2), reduction="sum"),
    ):
        back = Rollout.from_json(json.loads(json.dumps(spec.to_json())))
        assert back == spec and hash(back) == hash(spec)
    with pytest.raises(ConfigError, match="`maximum` must be an int >= `start`"):
        RolloutSchedule(start=3, maximum=2)


def test_bad_data_is_refused_before_any_work(tmp_path) -> None:
    plain = ArrayDataset(x=np.zeros((16, 3), np.float32), y=np.zeros((16, 3), np.float32))
    with pytest.raises(ConfigError, match=r"`data` must be a `TrajectoryWindows`.*ArrayDataset"):
        _loop(plain, Rollout(steps=2), checkpoint=str(tmp_path / "ck"))
    assert not (tmp_path / "ck").exists()
    with pytest.raises(ConfigError, match=r"span k=2 steps.*Build the windows with k >= 4"):
        _loop(_windows(k=2), Rollout(steps=4, schedule={0: 1, 5: 4}))
    with pytest.raises(ConfigError, match=r"targets='increments'"):
        _loop(_windows(targets="states"), Rollout(steps=2, residual=True))
    with pytest.raises(ConfigError, match=r"mean squared error.*loss='mae'"):
        _loop(_windows(), Rollout(steps=2), loss="mae")
    with pytest.raises(ConfigError, match=r"`rollout` must be a `Rollout`"):
        _loop(_windows(), {"steps": 2})


def test_a_backend_without_the_capability_refuses() -> None:
    with pytest.raises(
        NotSupportedError, match=r"Rollout training is not supported by the 'numpy'"
    ):
        _loop(_windows(), Rollout(steps=2))


def test_the_resume_key_names_the_rollout() -> None:
    from pipekit_train.core.spec._plan import RESUME_KEY_FIELDS

    assert "rollout" in RESUME_KEY_FIELDS  # a resume with another rollout is refused


def test_gradient_checkpointing_is_not_part_of_the_resume_key() -> None:
    class RolloutNumpy(NumpyAdapter):  # declares rollout training and its checkpointing
        capabilities = Capabilities(rollout=True, rollout_checkpointing=True)

    keys = [
        _loop(
            _windows(), Rollout(steps=2, gradient_checkpointing=flag), adapter=RolloutNumpy()
        ).plan.resume_key()
        for flag in (False, True)
    ]
    assert keys[0] == keys[1]  # memory, not math: a run may resume with the flag flipped
    assert "gradient_checkpointing" not in keys[0]["rollout"]
    # a checkpoint written before the field existed holds the same key
    old = {k: v for k, v in Rollout(steps=2).to_json().items() if k != "gradient_checkpointing"}
    assert keys[0]["rollout"] == old and Rollout.from_json(old) == Rollout(steps=2)
    # another rollout setting does change it
    other = _loop(_windows(), Rollout(steps=3), adapter=RolloutNumpy()).plan.resume_key()
    assert other["rollout"] != keys[0]["rollout"]


def test_the_default_reduction_leaves_the_json_and_resume_key_as_before() -> None:
    class RolloutNumpy(NumpyAdapter):
        capabilities = Capabilities(rollout=True)

    def key(rollout: Rollout) -> dict:
        return _loop(_windows(), rollout, adapter=RolloutNumpy()).plan.resume_key()["rollout"]

    assert "reduction" not in Rollout(steps=2).to_json()
    assert key(Rollout(steps=2, reduction="mean")) == key(Rollout(steps=2))
    summed = key(Rollout(steps=2, reduction="sum"))
    assert summed["reduction"] == "sum" and summed != key(Rollout(steps=2))


def test_a_backend_without_rollout_checkpointing_refuses_it(tmp_path) -> None:
    class RolloutNumpy(NumpyAdapter):  # rollout training, no checkpointing of its steps
        capabilities = Capabilities(rollout=True)

    with pytest.raises(
        NotSupportedError,
        match=r"Gradient checkpointing of the unrolled steps is not supported by the 'numpy'"
        r".*gradient_checkpointing=False",
    ):
        _loop(
            _windows(),
            Rollout(steps=2, gradient_checkpointing=True),
            adapter=RolloutNumpy(),
            checkpoint=str(tmp_path / "ck"),
        )
    assert not (tmp_path / "ck").exists()


def test_online_trainer_refuses_a_rollout_before_any_work(tmp_path) -> None:
    from pipekit_train.core import OnlineTrainer

    op = NumpyLinearOp("pipekit_train.core.testing:linear", in_size=3, out_size=3)
    with pytest.raises(
        ConfigError,
        match=r"an online stream of \(x, y\) pairs has no trajectories.*Received: "
        r"rollout=Rollout\(steps=4\)\. Train through the rollout with TrainingLoop",
    ):
        OnlineTrainer(
            op, adapter=NumpyAdapter(), checkpoint=str(tmp_path / "ck"), rollout=Rollout(steps=4)
        )
    assert not (tmp_path / "ck").exists()
    trainer = OnlineTrainer(op, adapter=NumpyAdapter(), rollout=None)  # None: one-step
    trainer({"x": np.ones((2, 3), np.float32), "y": np.ones((2, 3), np.float32)})
    assert trainer.step == 1


def _lin(a: np.ndarray, b: np.ndarray):
    return lambda x: x @ a + b


@pytest.mark.parametrize("residual", [False, True])
def test_rollout_loss_on_numpy_matches_neural_forward_and_the_one_step_loss(residual: bool) -> None:
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(3, 3)) * 0.3, rng.normal(size=3) * 0.1
    windows = _windows(k=3, targets="increments" if residual else "states")
    norm = windows.normalizer()
    batch = norm.apply(windows.get_batch(np.arange(5)))
    spec = rollout_spec(norm, residual, 1)
    mse = losses.get("mse")
    loss, pred = rollout_loss(
        np,
        spec=spec,
        model_fn=_lin(a, b),
        x=batch["x"],
        y=batch["y"],
        weights=(1.0, 1.0, 1.0),
        backprop="full",
        loss_fn=mse,
    )

    class Op:  # a model operator NeuralForward can call
        def __call__(self, x):
            return _lin(a, b)(np.asarray(x))

    forward = NeuralForward(Op(), normalizer=norm, residual=residual)
    raw = windows.get_batch(np.arange(5))
    state, want = raw["x"].astype(np.float64), []
    for _ in range(3):
        state = forward(state)
        want.append(state)
    states = raw["x"][:, None] + np.cumsum(raw["y"], axis=1) if residual else raw["y"]
    mx, sx = norm.mean["x"], norm.std["x"]
    terms = [
        np.mean(((w - mx) / sx - (s - mx) / sx) ** 2)
        for w, s in zip(want, states.transpose(1, 0, 2), strict=True)
    ]
    np.testing.assert_allclose(loss, np.mean(terms), rtol=1e-5)
    # k = 1 without a normalizer is the one-step loss on the same pairs
    plain = _windows(k=1, targets="increments" if residual else "states")
    pairs = plain.get_batch(np.arange(6))
    one, _ = rollout_loss(
        np,
        spec=rollout_spec(None, residual, 1),
        model_fn=_lin(a, b),
        x=pairs["x"],
        y=pairs["y"],
        weights=(1.0,),
        backprop="full",
        loss_fn=mse,
    )
    np.testing.assert_allclose(one, mse(_lin(a, b)(pairs["x"]), pairs["y"]), rtol=1e-6)


@pytest.mark.parametrize("inputs", [False, True])
def test_the_summed_loss_is_the_weighted_sum_of_the_step_losses(inputs: bool) -> None:
    """`reduction="sum"`: `sum_i w_i loss_i` (trainax), the mean times `sum_i w_i`; the
    default mean is `sum_i w_i loss_i / sum_i w_i` exactly as before."""
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(3, 3)) * 0.3, rng.normal(size=3) * 0.1
    windows = _windows(k=3, targets="increments")
    batch = windows.get_batch(np.arange(5))
    weights = (1.0, 0.5, 2.0)
    spec = rollout_spec(None, True, 1)
    if inputs:  # the `ModelInputs` path: a history of one is the state alone
        from pipekit_train.core.data import ModelInputs

        spec = rollout_spec(None, True, 1, ModelInputs(state_shape=(3,)))
    kw = {
        "spec": spec,
        "model_fn": _lin(a, b),
        "x": batch["x"],
        "y": batch["y"],
        "weights": weights,
        "backprop": "full",
        "loss_fn": losses.get("mse"),
    }
    mean, _ = rollout_loss(np, **kw)
    total, _ = rollout_loss(np, **kw, reduction="sum")
    state, truth, terms = batch["x"], batch["x"], []
    for i in range(3):  # the numpy reference
        state = state + _lin(a, b)(state)
        truth = truth + batch["y"][:, i]
        terms.append(np.mean((state - truth) ** 2))
    want = sum(w * t for w, t in zip(weights, terms, strict=True))
    np.testing.assert_allclose(total, want, rtol=1e-12)
    np.testing.assert_allclose(mean, want / sum(weights), rtol=1e-12)
    np.testing.assert_allclose(total, mean * sum(weights), rtol=1e-12)
    with pytest.raises(ConfigError, match=r"Received: reduction='total'"):
        rollout_loss(np, **kw, reduction="total")


def test_the_feed_draws_the_noise_once_for_every_backend_shard_and_resume() -> None:
    import dataclasses

    from pipekit_train.core.rollout import NOISE_KEY, rollout_noise
    from pipekit_train.core.run._context import RunContext

    windows = _windows(k=1)  # a plain plan of these windows, given a rollout below
    norm = windows.normalizer()
    plain = TrainingLoop(
        NumpyLinearOp("pipekit_train.core.testing:linear", in_size=3, out_size=3),
        windows,
        adapter=NumpyAdapter(),
        normalizer=norm,
        max_steps=4,
        batch_size=4,
        seed=5,
        progress=False,
    ).plan
    assert NOISE_KEY not in next(RunContext(plain).train_batches())  # no rollout: no noise
    rollout = Rollout(steps=1, noise_std=0.1)  # the plan of a backend that accumulates 2
    plan = dataclasses.replace(plain, rollout=rollout, accumulate_grad_batches=2)
    ctx = RunContext(plan)
    whole = ctx.train_batches()
    batches = [next(whole) for _ in range(6)]
    for i, batch in enumerate(batches):  # a pure function of (seed, global batch index)
        assert batch[NOISE_KEY].shape == batch["x"].shape
        assert batch[NOISE_KEY].dtype == batch["x"].dtype
        want = rollout_noise(5, i, batch["x"].shape, 0.1, dtype=batch["x"].dtype)
        np.testing.assert_array_equal(batch[NOISE_KEY], want)
    assert not np.array_equal(batches[0][NOISE_KEY], batches[1][NOISE_KEY])
    np.testing.assert_allclose(np.std(batches[0][NOISE_KEY]), 0.1, rtol=0.5)
    # a second shard holds the second half of the global batch's rows and noise
    half = next(RunContext(plan).train_batches(shard=(1, 2)))
    np.testing.assert_array_equal(half["x"], batches[0]["x"][2:])
    np.testing.assert_array_equal(half[NOISE_KEY], batches[0][NOISE_KEY][2:])
    # a run resumed at step 2 (accumulating 2 batches) continues at global batch 4
    resumed = RunContext(plan)
    resumed.progress.resume_at(2)
    again = next(resumed.train_batches(_state_after(plan, 4)))
    np.testing.assert_array_equal(again["x"], batches[4]["x"])
    np.testing.assert_array_equal(again[NOISE_KEY], batches[4][NOISE_KEY])


def _state_after(plan: object, n: int) -> dict:
    from pipekit_train.core.run._context import RunContext

    it = RunContext(plan).train_batches()  # type: ignore[arg-type]
    for _ in range(n):
        next(it)
    return it.get_state()
