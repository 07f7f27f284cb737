"""Solvers in the rollout on Equinox: the diverted chain's loss and updates are a
hand-written jax/optax reference's (the gradient through the reference stepper, as
trainax's `DivertedChainBranchOne`, or stopped with `cut_div_chain`), a stepper that
changes the shape is refused before any work, and a resumed run ends with the same
bytes. (A corrected model's device rollout: `test_equinox_rollout.py`.)"""

from __future__ import annotations

from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from pipekit_train.core import (
    Checkpoint,
    CheckpointError,
    ConfigError,
    Rollout,
    TrainingLoop,
    TrajectoryWindows,
)
from pipekit_train.core.testing import periodic_diffusion
from pipekit_train.equinox import EquinoxModelOp

D = 4


def _states() -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.cumsum(rng.normal(size=(4, 12, D)) * 0.2, axis=1).astype(np.float32)


def _op() -> EquinoxModelOp:
    return EquinoxModelOp(
        "pipekit_train.equinox.testing:mlp", in_size=D, out_size=D, width=8, seed=0
    )


def _loop(rollout: Rollout, **kw) -> TrainingLoop:
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
    return TrainingLoop(
        _op(), TrajectoryWindows(_states(), k=3, targets="increments"), rollout=rollout, **args
    )


def _diffuse(x):
    return x + 0.1 * (jnp.roll(x, 1, axis=-1) - 2.0 * x + jnp.roll(x, -1, axis=-1))


@pytest.mark.parametrize("cut", [False, True])
def test_the_diverted_chain_matches_a_hand_written_reference(cut: bool) -> None:
    rollout = Rollout(
        steps=3, residual=True, target="diverted", ref_stepper=periodic_diffusion, cut_div_chain=cut
    )
    art = _loop(rollout).run()
    windows = TrajectoryWindows(_states(), k=3, targets="increments")
    model = _op().model
    opt = optax.adam(0.01)
    opt_state = opt.init(eqx.filter(model, eqx.is_inexact_array))

    def ref_loss(m, x):  # trainax: ref = ref_stepper(pred), then pred = stepper(pred)
        pred, total = x, 0.0
        for _ in range(3):
            ref = _diffuse(pred)
            if cut:
                ref = jax.lax.stop_gradient(ref)
            pred = pred + jax.vmap(m)(pred)
            total = total + jnp.mean((pred - ref) ** 2)
        return total / 3

    ref_losses = []
    for step in range(3):
        b = windows.get_batch((np.arange(8) + step * 8) % len(windows))
        loss, grads = eqx.filter_value_and_grad(ref_loss)(model, jnp.asarray(b["x"]))
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


def test_a_stepper_that_changes_the_shape_is_refused(tmp_path: Path) -> None:
    rollout = Rollout(
        steps=3, residual=True, coarse_stepper="jax.numpy:ravel", correction="parallel"
    )
    with pytest.raises(
        ConfigError, match=r"`coarse_stepper` must return.*\(2, 4\) to shape \(8,\)"
    ):
        _loop(rollout, checkpoint=Checkpoint(tmp_path / "ck"))
    assert not (tmp_path / "ck").exists()


def test_resume_with_steppers_is_exact(tmp_path: Path) -> None:
    rollout = Rollout(
        steps=3,
        residual=True,
        noise_std=0.05,
        target="diverted",
        ref_stepper=periodic_diffusion,
        coarse_stepper=periodic_diffusion,
        correction="parallel",
    )
    policy = Checkpoint(tmp_path / "ck", every_n_steps=4, async_save=False)
    kw = {"shuffle": True, "max_steps": 8}
    _loop(rollout, checkpoint=policy, **{**kw, "max_steps": 4}).run()
    resumed = _loop(rollout, checkpoint=policy, **kw).run()
    straight = _loop(rollout, **kw).run()
    assert resumed.resumed_from_step == 4
    assert resumed.model.serialize_weights() == straight.model.serialize_weights()
    assert resumed.history["loss"] == straight.history["loss"]
    other = Rollout(steps=3, residual=True, noise_std=0.05)  # the same without the solver
    with pytest.raises(CheckpointError, match="rollout"):
        _loop(other, checkpoint=policy, max_steps=12).run()


def test_the_summed_loss_trains_as_the_mean_with_a_larger_step() -> None:
    """`Rollout(reduction="sum")`: the loss and its gradient are `k` times the mean's
    (unit weights), so SGD at `lr` moves as the mean at `k * lr`; validation stays the mean."""

    def run(reduction: str, lr: float):
        rollout = Rollout(steps=3, residual=True, reduction=reduction)
        windows = TrajectoryWindows(_states(), k=3, targets="increments")
        sgd = {"name": "sgd", "learning_rate": lr}
        return _loop(rollout, optimizer_config=sgd, max_steps=1, validation=windows).run()

    summed, mean = run("sum", 0.01), run("mean", 0.03)
    np.testing.assert_allclose(summed.history["loss"][0], 3 * mean.history["loss"][0], rtol=1e-6)
    np.testing.assert_allclose(summed.history["val_loss"], mean.history["val_loss"], rtol=1e-5)
    for got, want in zip(
        jax.tree.leaves(eqx.filter(summed.model.model, eqx.is_array)),
        jax.tree.leaves(eqx.filter(mean.model.model, eqx.is_array)),
        strict=True,
    ):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-7)
