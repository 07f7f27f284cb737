"""Rollout training on Equinox: the k-step prediction is `NeuralForward`'s, the loss and
the updates are a hand-written jax/optax reference's, k = 1 is one-step training, and a
resumed run mid-schedule ends with the same bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from pipekit_train.core import (
    Checkpoint,
    CheckpointError,
    NeuralForward,
    Rollout,
    TrainingLoop,
    TrajectoryWindows,
    losses,
)
from pipekit_train.equinox import Equinox, EquinoxModelOp
from pipekit_train.equinox._rollout import RolloutLoss

D = 3


def _states() -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.cumsum(rng.normal(size=(4, 16, D)) * 0.2, axis=1).astype(np.float32)


def _op() -> EquinoxModelOp:
    return EquinoxModelOp(
        "pipekit_train.equinox.testing:mlp", in_size=D, out_size=D, width=8, seed=0
    )


def _loop(data: TrajectoryWindows, rollout: Rollout | None, **kw) -> TrainingLoop:
    args = {
        "loss": "mse",
        "optimizer_config": {"name": "adam", "lr": 0.01},
        "batch_size": 8,
        "max_steps": 3,
        "shuffle": False,
        "seed": 3,
        "progress": False,
    }
    args.update(kw)
    return TrainingLoop(_op(), data, rollout=rollout, **args)


def _assert_same_weights(a: Any, b: Any, *, rtol: float, atol: float) -> None:
    """The array leaves of two artifacts' models agree to the tolerances."""
    for x, y in zip(
        jax.tree.leaves(eqx.filter(a.model.model, eqx.is_array)),
        jax.tree.leaves(eqx.filter(b.model.model, eqx.is_array)),
        strict=True,
    ):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


@pytest.mark.parametrize("residual", [False, True])
def test_the_prediction_inside_training_is_neural_forward_k_times(residual: bool) -> None:
    windows = TrajectoryWindows(_states(), k=4, targets="increments" if residual else "states")
    norm = windows.normalizer()
    raw = windows.get_batch(np.arange(6))
    batch = {k: jnp.asarray(v) for k, v in norm.apply(raw).items()}
    rl = RolloutLoss(Rollout(steps=4, residual=residual), norm, losses.get("mse"), seed=0)
    op = _op()
    _, pred = rl.predict(jax.vmap(op.model), batch, 4)
    pred = np.asarray(pred) * norm.std["y"] + norm.mean["y"]  # physical targets
    states = raw["x"][:, None] + np.cumsum(pred, axis=1) if residual else pred
    forward = NeuralForward(op, normalizer=norm, residual=residual)
    state = raw["x"]
    for i in range(4):
        state = forward(state)
        np.testing.assert_allclose(states[:, i], state, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backprop", ["full", "last"])
def test_loss_and_updates_match_a_hand_written_reference(backprop: str) -> None:
    weights = (1.0, 0.5, 0.25, 2.0)
    windows = TrajectoryWindows(_states(), k=4, targets="increments")
    n = 8
    art = _loop(
        windows, Rollout(steps=4, weights=weights, backprop=backprop, residual=True), batch_size=n
    ).run()

    # the reference: plain equinox + optax, the same batches (no shuffle: windows in order)
    model = _op().model
    opt = optax.adam(0.01)
    opt_state = opt.init(eqx.filter(model, eqx.is_inexact_array))

    def ref_loss(m, x, y):
        s, truth, total = x, x, 0.0
        for i in range(4):
            truth = truth + y[:, i]
            nxt = s + jax.vmap(m)(s)
            if backprop == "last" and i < 3:
                nxt = jax.lax.stop_gradient(nxt)
            total = total + weights[i] * jnp.mean((nxt - truth) ** 2)
            s = nxt
        return total / sum(weights)

    ref_losses = []
    for step in range(3):
        idx = (np.arange(n) + step * n) % len(windows)
        b = windows.get_batch(idx)
        loss, grads = eqx.filter_value_and_grad(ref_loss)(
            model, jnp.asarray(b["x"]), jnp.asarray(b["y"])
        )
        updates, opt_state = opt.update(grads, opt_state, eqx.filter(model, eqx.is_inexact_array))
        model = eqx.apply_updates(model, updates)
        ref_losses.append(float(loss))
    np.testing.assert_allclose(art.history["loss"], ref_losses, rtol=1e-5)
    for got, want in zip(
        jax.tree.leaves(eqx.filter(art.model.model, eqx.is_array)),
        jax.tree.leaves(eqx.filter(model, eqx.is_array)),
        strict=True,
    ):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_one_step_rollout_is_one_step_training() -> None:
    windows = TrajectoryWindows(_states(), k=1)
    norm = windows.normalizer()
    a = _loop(windows, Rollout(steps=1), normalizer=norm, max_steps=5).run()
    b = _loop(windows, None, normalizer=norm, max_steps=5).run()
    np.testing.assert_allclose(a.history["loss"], b.history["loss"], rtol=1e-6)
    _assert_same_weights(a, b, rtol=1e-6, atol=1e-7)


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
    other = Rollout(steps=4, residual=True, noise_std=0.05, backprop=2)
    with pytest.raises(CheckpointError, match="rollout"):
        _loop(windows, other, max_steps=12, checkpoint=policy, **kw).run()


def test_a_rollout_monitor_sees_one_step_per_application() -> None:
    from pipekit_train.core.testing import check_rollout_monitor_under_rollout

    check_rollout_monitor_under_rollout(
        lambda: EquinoxModelOp("pipekit_train.equinox.testing:mlp", in_size=2, out_size=2, seed=0),
        None,
    )


def test_a_skipped_update_counts_on_the_schedule() -> None:
    from pipekit_train.core.testing import check_rollout_schedule_counts_skipped_updates

    check_rollout_schedule_counts_skipped_updates(
        lambda: EquinoxModelOp("pipekit_train.equinox.testing:mlp", in_size=2, out_size=2, seed=0),
        None,
    )


def test_rollout_monitor_on_a_rollout_trained_run_scores_the_one_step_emulator() -> None:
    """A `RolloutMonitor` on a rollout-trained run rolls out the emulator one step at a
    time: its last metrics are `rollout_validation` of `NeuralForward` on the final weights."""
    from pipekit_train.core import RolloutMonitor, rollout_validation

    states = _states()
    windows = TrajectoryWindows(states[:3], k=4, targets="increments")
    held_out = states[3:]
    norm = windows.normalizer()
    monitor = RolloutMonitor(held_out, 10, residual=True)
    spec = Rollout(steps=4, residual=True, schedule={0: 1, 2: 4})
    art = _loop(
        windows,
        spec,
        normalizer=norm,
        validation=TrajectoryWindows(held_out, k=4, targets="increments"),
        validate_every_n_steps=2,
        max_steps=4,
        callbacks=[monitor],
    ).run()
    steps, values = art.history.series("val_rollout_nrmse_lead_1_10")
    assert steps == [2, 4]
    want = rollout_validation(NeuralForward(art.model, norm, residual=True), held_out, 10)
    np.testing.assert_allclose(values[-1], want.metrics["val_rollout_nrmse_lead_1_10"], rtol=1e-5)
    assert values[-1] != pytest.approx(monitor.persistence.metrics["val_rollout_nrmse_lead_1_10"])


@pytest.mark.parametrize("fused", [2, 3])
def test_a_schedule_picks_each_updates_length_fused_or_not(fused: int) -> None:
    """A schedule's updates run the step of their length, chosen on the host (one
    update at a time; or K fused updates in one stage), or the on-device switch (K fused
    updates across a change of length, `fused=2` here): the same training either way."""
    windows = TrajectoryWindows(_states(), k=4, targets="increments")
    norm = windows.normalizer()
    spec = Rollout(steps=4, residual=True, schedule={0: 1, 3: 2, 6: 4})
    kw = {"normalizer": norm, "shuffle": True, "max_steps": 12}
    one = _loop(windows, spec, **kw).run()
    many = _loop(windows, spec, adapter=Equinox(steps_per_execution=fused), **kw).run()
    np.testing.assert_allclose(many.history["loss"], one.history["loss"], rtol=1e-5)
    _assert_same_weights(one, many, rtol=1e-5, atol=1e-6)
    # the per-update length: the k = 1 stage's loss is the one-step loss of its batch
    fixed = _loop(windows, Rollout(steps=1, residual=True), **{**kw, "max_steps": 3}).run()
    np.testing.assert_allclose(one.history["loss"][:3], fixed.history["loss"], rtol=1e-6)
