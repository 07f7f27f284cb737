"""Rollout training on Keras (this process's backend; `test_keras_backends.py` runs the
file again on torch): the k-step prediction is `NeuralForward`'s, the loss and the updates
are a hand-written Keras reference's, k = 1 is one-step training, accumulation and fused
steps count optimizer updates, and a resumed run mid-schedule with noise ends with the same
bytes."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest
from keras import ops

from pipekit_train.core import (
    Checkpoint,
    CheckpointError,
    ConfigError,
    NeuralForward,
    Rollout,
    TrainingLoop,
    TrajectoryWindows,
    losses,
)
from pipekit_train.keras import Keras, KerasModelOp
from pipekit_train.keras._rollout_train import RolloutTraining

D = 3
BACKEND = keras.backend.backend()


def _states() -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.cumsum(rng.normal(size=(4, 16, D)) * 0.2, axis=1).astype(np.float32)


def _op(**kw: object) -> KerasModelOp:
    return KerasModelOp("pipekit_train.keras.testing:mlp", in_size=D, out_size=D, width=8, **kw)


def _loop(data: TrajectoryWindows, rollout: Rollout | None, **kw: object) -> TrainingLoop:
    args: dict[str, object] = {
        "loss": "mse",
        "optimizer_config": {"name": "adam", "lr": 0.01},
        "batch_size": 8,
        "max_steps": 3,
        "shuffle": False,
        "seed": 3,
        "progress": False,
    }
    args.update(kw)
    return TrainingLoop(_op(), data, rollout=rollout, **args)  # type: ignore[arg-type]


def _weights(art: object) -> list[np.ndarray]:
    return [ops.convert_to_numpy(v.value) for v in art.model.model.weights]  # type: ignore[attr-defined]


@pytest.mark.parametrize("residual", [False, True])
def test_the_prediction_inside_training_is_neural_forward_k_times(residual: bool) -> None:
    windows = TrajectoryWindows(_states(), k=4, targets="increments" if residual else "states")
    norm = windows.normalizer()
    raw = windows.get_batch(np.arange(6))
    batch = norm.apply(raw)
    op = _op()
    training = RolloutTraining(
        op.model, Rollout(steps=4, residual=residual), norm, losses.get("mse"), state_ndim=1
    )
    x, y = ops.convert_to_tensor(batch["x"]), ops.convert_to_tensor(batch["y"])
    _, pred = training.predict(lambda s: op.model(s, training=True), x, y, 4)
    pred = ops.convert_to_numpy(pred) * norm.std["y"] + norm.mean["y"]  # physical targets
    states = raw["x"][:, None] + np.cumsum(pred, axis=1) if residual else pred
    forward = NeuralForward(op, normalizer=norm, residual=residual)
    state = raw["x"]
    for i in range(4):
        state = forward(state)
        np.testing.assert_allclose(states[:, i], state, rtol=1e-5, atol=1e-5)


def _value_and_grad(model: keras.Model, loss_of: object) -> tuple[float, list[object]]:
    """The loss `loss_of(call)` and its gradients by hand, on this backend."""
    if BACKEND == "jax":
        import jax

        fixed = [v.value for v in model.non_trainable_variables]

        def f(params: list[object]) -> object:
            return loss_of(lambda s: model.stateless_call(params, fixed, s)[0])  # type: ignore[operator]

        loss, grads = jax.value_and_grad(f)([v.value for v in model.trainable_variables])
        return float(loss), list(grads)
    for v in model.trainable_variables:
        v.value.grad = None
    loss = loss_of(model)  # type: ignore[operator]
    loss.backward()
    return float(loss.detach()), [v.value.grad for v in model.trainable_variables]


@pytest.mark.parametrize("backprop", ["full", "last"])
def test_loss_and_updates_match_a_hand_written_reference(backprop: str) -> None:
    weights = (1.0, 0.5, 0.25, 2.0)
    windows = TrajectoryWindows(_states(), k=4, targets="increments")
    n, lr = 8, 0.05
    spec = Rollout(steps=4, weights=weights, backprop=backprop, residual=True)
    art = _loop(windows, spec, batch_size=n, optimizer_config={"name": "sgd", "lr": lr}).run()

    # the reference: the same Keras model, a loop in keras.ops, plain SGD by hand
    model = _op().model

    def ref_loss(call: object, x: object, y: object) -> object:
        s, truth, total = x, x, 0.0
        for i in range(4):
            truth = truth + y[:, i]  # type: ignore[index]
            nxt = s + call(s)  # type: ignore[operator]
            if backprop == "last" and i < 3:
                nxt = ops.stop_gradient(nxt)
            total = total + weights[i] * ops.mean((nxt - truth) ** 2)
            s = nxt
        return total / sum(weights)

    ref_losses = []
    for step in range(3):
        b = windows.get_batch((np.arange(n) + step * n) % len(windows))
        x, y = ops.convert_to_tensor(b["x"]), ops.convert_to_tensor(b["y"])
        loss, grads = _value_and_grad(model, lambda call, x=x, y=y: ref_loss(call, x, y))
        for v, g in zip(model.trainable_variables, grads, strict=True):
            v.assign(ops.convert_to_numpy(v.value) - lr * ops.convert_to_numpy(g))
        ref_losses.append(loss)
    np.testing.assert_allclose(art.history["loss"], ref_losses, rtol=1e-5)
    want = [ops.convert_to_numpy(v.value) for v in model.weights]
    for got, ref in zip(_weights(art), want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_one_step_rollout_is_one_step_training() -> None:
    windows = TrajectoryWindows(_states(), k=1)
    norm = windows.normalizer()
    a = _loop(windows, Rollout(steps=1), normalizer=norm, max_steps=5).run()
    b = _loop(windows, None, normalizer=norm, max_steps=5).run()
    np.testing.assert_allclose(a.history["loss"], b.history["loss"], rtol=1e-6)
    for x, y in zip(_weights(a), _weights(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


def test_accumulation_and_fused_steps_schedule_by_optimizer_update() -> None:
    # the length follows optimizer updates: two accumulated half batches (and, on jax,
    # fused executions) train exactly like whole batches at the same schedule
    windows = TrajectoryWindows(_states(), k=4, targets="increments")
    spec = Rollout(steps=4, residual=True, schedule={0: 1, 2: 2, 3: 4})
    sgd = {"name": "sgd", "lr": 0.05}
    whole = _loop(windows, spec, optimizer_config=sgd, max_steps=4).run()
    one = _loop(windows, Rollout(steps=1, residual=True), optimizer_config=sgd).run()
    np.testing.assert_allclose(whole.history["loss"][:2], one.history["loss"][:2], rtol=1e-6)
    assert abs(whole.history["loss"][2] - one.history["loss"][2]) > 1e-4  # k = 2 from update 2
    halves = _loop(
        windows, spec, optimizer_config=sgd, max_steps=4, batch_size=4, accumulate_grad_batches=2
    ).run()
    for x, y in zip(_weights(whole), _weights(halves), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    if BACKEND == "jax":
        fused = _loop(
            windows, spec, optimizer_config=sgd, max_steps=4, adapter=Keras(steps_per_execution=3)
        ).run()
        assert fused.history["loss"] == whole.history["loss"]
        assert fused.model.serialize_weights() == whole.model.serialize_weights()


@pytest.mark.slow
def test_resume_mid_schedule_with_noise_is_exact(tmp_path: Path) -> None:
    windows = TrajectoryWindows(_states(), k=4, targets="increments")
    norm = windows.normalizer()
    spec = Rollout(steps=4, residual=True, noise_std=0.05, backprop=2, schedule={0: 1, 3: 2, 6: 4})
    policy = Checkpoint(tmp_path / "ck", every_n_steps=4, async_save=False)
    kw = {"normalizer": norm, "shuffle": True, "validation": windows, "validate_every_n_steps": 4}
    _loop(windows, spec, max_steps=4, checkpoint=policy, **kw).run()
    resumed = _loop(windows, spec, max_steps=9, checkpoint=policy, **kw).run()
    straight = _loop(windows, spec, max_steps=9, **kw).run()
    assert resumed.resumed_from_step == 4
    assert resumed.model.serialize_weights() == straight.model.serialize_weights()
    assert resumed.history["loss"] == straight.history["loss"]
    quiet = _loop(windows, Rollout(**{**spec.to_json(), "noise_std": 0.0}), max_steps=9, **kw)
    assert quiet.run().history["loss"] != straight.history["loss"]  # the noise is used
    other = Rollout(steps=4, residual=True, noise_std=0.05, backprop=2)
    with pytest.raises(CheckpointError, match="rollout"):
        _loop(windows, other, max_steps=12, checkpoint=policy, **kw).run()


def test_a_model_with_layer_state_is_refused_before_any_work() -> None:
    windows = TrajectoryWindows(_states(), k=2, targets="increments")
    op = KerasModelOp(
        "pipekit_train.keras.testing:mlp", in_size=D, out_size=D, width=8, batch_norm=True
    )
    with pytest.raises(ConfigError, match=r"layer state.*Received: a model with non-trainable"):
        TrainingLoop(
            op, windows, rollout=Rollout(steps=2, residual=True), batch_size=4, max_steps=2
        )
