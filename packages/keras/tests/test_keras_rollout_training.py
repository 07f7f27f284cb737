"""Rollout training on Keras (this process's backend; `test_keras_backends.py` runs the
file again on torch): the k-step prediction is `NeuralForward`'s, the loss and the updates
are a hand-written Keras reference's, k = 1 is one-step training, accumulation and fused
steps count optimizer updates, and a run resumed mid-schedule with noise (after a
checkpoint, and after a SIGKILL) ends with the same bytes. The shared checks live in
`core.testing`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
from keras import ops

from pipekit_train.core import ConfigError, Rollout, TrainingLoop, TrajectoryWindows, losses
from pipekit_train.core.testing import (
    check_one_step_rollout,
    check_rollout_monitor_under_rollout,
    check_rollout_prediction,
    check_rollout_resume,
    check_rollout_schedule_counts_skipped_updates,
)
from pipekit_train.keras import Keras, KerasModelOp
from pipekit_train.keras._rollout import RolloutLoss

D = 3
BACKEND = keras.backend.backend()


def _states() -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.cumsum(rng.normal(size=(4, 16, D)) * 0.2, axis=1).astype(np.float32)


def _op(**kw: object) -> KerasModelOp:
    return KerasModelOp("pipekit_train.keras.testing:mlp", in_size=D, out_size=D, width=8, **kw)


def _op2() -> KerasModelOp:
    """The shared checks' model: 2 states in, 2 out, the same weights every call."""
    return KerasModelOp("pipekit_train.keras.testing:mlp", in_size=2, out_size=2, width=16)


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


def _predict(model: Any, batch: dict, normalizer: Any, residual: bool, k: int) -> np.ndarray:
    training = RolloutLoss(
        model.model, Rollout(steps=k, residual=residual), normalizer, losses.get("mse")
    )
    x, y = ops.convert_to_tensor(batch["x"]), ops.convert_to_tensor(batch["y"])
    _, pred = training.predict(lambda s: model.model(s, training=True), x, y, k)
    return ops.convert_to_numpy(pred)


def test_the_prediction_inside_training_is_neural_forward_k_times() -> None:
    check_rollout_prediction(_op2, _predict)


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


@pytest.mark.parametrize(
    ("backprop", "reduction"), [("full", "mean"), ("last", "mean"), ("full", "sum")]
)
def test_loss_and_updates_match_a_hand_written_reference(backprop: str, reduction: str) -> None:
    weights = (1.0, 0.5, 0.25, 2.0)
    windows = TrajectoryWindows(_states(), k=4, targets="increments")
    n, lr = 8, 0.05
    spec = Rollout(steps=4, weights=weights, backprop=backprop, residual=True, reduction=reduction)
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
        return total if reduction == "sum" else total / sum(weights)

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
    check_one_step_rollout(_op2, Keras())


def test_a_rollout_monitor_sees_one_step_per_application() -> None:
    check_rollout_monitor_under_rollout(_op2, Keras())


def test_a_skipped_update_counts_on_the_schedule() -> None:
    check_rollout_schedule_counts_skipped_updates(_op2, Keras())


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
    check_rollout_resume(_op2, Keras(), tmp_path)


# kill-and-resume mid-schedule: the conformance suite (test_rollout_exact_resume_after_sigkill)


def test_the_noise_of_core_s_feed_reaches_the_loss() -> None:
    windows = TrajectoryWindows(_states(), k=2, targets="increments")
    spec = Rollout(steps=2, residual=True, noise_std=0.1)
    noisy = _loop(windows, spec).run()
    quiet = _loop(windows, Rollout(steps=2, residual=True)).run()
    assert noisy.history["loss"][0] != quiet.history["loss"][0]


def test_a_model_with_layer_state_is_refused_before_any_work() -> None:
    windows = TrajectoryWindows(_states(), k=2, targets="increments")
    op = KerasModelOp(
        "pipekit_train.keras.testing:mlp", in_size=D, out_size=D, width=8, batch_norm=True
    )
    with pytest.raises(ConfigError, match=r"layer state.*Received: a model with non-trainable"):
        TrainingLoop(
            op, windows, rollout=Rollout(steps=2, residual=True), batch_size=4, max_steps=2
        )


def test_gradient_checkpointing_recomputes_each_step_with_the_same_updates() -> None:
    windows = TrajectoryWindows(_states(), k=4, targets="increments")
    runs = [
        _loop(
            windows,
            Rollout(steps=4, residual=True, backprop=2, gradient_checkpointing=flag),
            normalizer=windows.normalizer(),
        ).run()
        for flag in (False, True)
    ]
    np.testing.assert_allclose(runs[0].history["loss"], runs[1].history["loss"], rtol=1e-6)
    for x, y in zip(_weights(runs[0]), _weights(runs[1]), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)

    # the recomputation is there: a remat in jax's graph, a second call per step on torch
    model = _op().model
    spec = Rollout(steps=3, residual=True, gradient_checkpointing=True)
    training = RolloutLoss(model, spec, None, losses.get("mse"))
    b = windows.get_batch(np.arange(4))
    x, y = ops.convert_to_tensor(b["x"]), ops.convert_to_tensor(b["y"])
    if BACKEND == "jax":
        import jax

        def f(params: list[object]) -> object:
            call = lambda s: model.stateless_call(params, [], s)[0]  # noqa: E731
            return training.predict(call, x, y, 3)[0]

        graph = str(jax.make_jaxpr(jax.grad(f))([v.value for v in model.trainable_variables]))
        assert "remat" in graph  # absent without gradient_checkpointing
    else:
        calls = []

        def counted(s: object) -> object:
            calls.append(1)
            return model(s)

        loss, _ = training.predict(counted, x, y, 3)
        assert len(calls) == 3
        loss.backward()
        assert len(calls) == 6
