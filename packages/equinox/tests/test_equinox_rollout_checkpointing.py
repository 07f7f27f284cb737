"""`Rollout(gradient_checkpointing=True)` on Equinox: the unrolled steps' model
applications are rematerialised (`jax.checkpoint`), the losses and the weights are the
same as without it, and a run resumes across a flip of the flag."""

from __future__ import annotations

from pathlib import Path

import equinox as eqx
import jax
import numpy as np
import pytest

from pipekit_train.core import Checkpoint, Rollout, TrainingLoop, TrajectoryWindows
from pipekit_train.equinox import EquinoxModelOp
from pipekit_train.equinox._step_backend import EquinoxStepBackend

D = 3


@pytest.fixture(scope="module")
def windows() -> TrajectoryWindows:
    rng = np.random.default_rng(0)
    states = np.cumsum(rng.normal(size=(4, 16, D)) * 0.2, axis=1).astype(np.float32)
    return TrajectoryWindows(states, k=4, targets="increments")


def _loop(windows: TrajectoryWindows, rollout: Rollout, **kw) -> TrainingLoop:
    args = {
        "optimizer_config": {"name": "adam", "lr": 0.01},
        "normalizer": windows.normalizer(),
        "batch_size": 8,
        "max_steps": 6,
        "seed": 3,
        "progress": False,
    }
    args.update(kw)
    op = EquinoxModelOp(
        "pipekit_train.equinox.testing:mlp", in_size=D, out_size=D, width=8, depth=2, seed=0
    )
    return TrainingLoop(op, windows, rollout=rollout, **args)


def _spec(flag: bool, backprop: str | int = "full") -> Rollout:
    return Rollout(
        steps=4,
        residual=True,
        backprop=backprop,
        noise_std=0.05,
        schedule={0: 2, 3: 4},
        gradient_checkpointing=flag,
    )


def _leaves(artifact) -> list[np.ndarray]:
    return [np.asarray(a) for a in jax.tree.leaves(eqx.filter(artifact.model.model, eqx.is_array))]


@pytest.mark.slow
def test_checkpointing_gives_the_same_losses_and_weights(windows) -> None:
    # cut BPTT every 2 steps, with noise, across both lengths of the schedule
    plain = _loop(windows, _spec(False, backprop=2)).run()
    ckpt = _loop(windows, _spec(True, backprop=2)).run()
    np.testing.assert_allclose(ckpt.history["loss"], plain.history["loss"], rtol=1e-5)
    for got, want in zip(_leaves(ckpt), _leaves(plain), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_flag_rematerialises_the_unrolled_steps(windows) -> None:
    def remats(flag: bool) -> int:
        loop = _loop(windows, _spec(flag))
        backend = EquinoxStepBackend(loop.plan, loop.plan.adapter)
        state = backend.init_state()
        batch = backend.put(windows.get_batch(np.arange(8)))
        return str(jax.make_jaxpr(backend.fns._flat_step)(state.leaves, batch)).count("remat")

    # one checkpointed model application per unrolled step, in each branch of the schedule
    assert remats(False) == 0
    assert remats(True) == 2 + 4


@pytest.mark.slow
def test_a_run_resumes_with_the_flag_flipped(windows, tmp_path: Path) -> None:
    policy = Checkpoint(tmp_path / "ck", every_n_steps=3, async_save=False)
    _loop(windows, _spec(False), max_steps=3, checkpoint=policy).run()
    resumed = _loop(windows, _spec(True), checkpoint=policy).run()
    straight = _loop(windows, _spec(False)).run()
    assert resumed.resumed_from_step == 3
    np.testing.assert_allclose(resumed.history["loss"], straight.history["loss"], rtol=1e-5)
