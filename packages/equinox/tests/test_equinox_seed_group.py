"""`SeedGroup` on Equinox: one vmapped step for every member, each member its single run."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import equinox as eqx
import jax
import numpy as np
import pytest

from pipekit_train.core import Checkpoint, ConfigError, SeedGroup, TrainingLoop
from pipekit_train.core.checkpoint import open_store
from pipekit_train.core.testing import regression_task
from pipekit_train.equinox import Equinox, EquinoxModelOp

SEEDS = [0, 4, 9]
STEPS = 30
HERE = Path(__file__).resolve().parent


def loop(
    seed: int = 0,
    *,
    steps: int = STEPS,
    directory: Path | None = None,
    group_step: str = "vmap",
    **kwargs,
) -> TrainingLoop:
    """The description the tests group (the kill worker imports it too); the vmapped
    group step unless `group_step` says otherwise."""
    train, val = regression_task()
    options = {
        "adapter": Equinox(group_step=group_step),
        "optimizer_config": {"name": "adam", "lr": 0.02},
        "batch_size": 16,
        "max_steps": steps,
        "validate_every_n_steps": 10,
        "progress": False,
    }
    options.update(kwargs)
    checkpoint = None
    if directory is not None:
        checkpoint = Checkpoint(directory, every_n_steps=10, max_to_keep=None)
    model = EquinoxModelOp(
        "pipekit_train.equinox.testing:dropout_mlp", in_size=4, out_size=1, seed=seed
    )
    return TrainingLoop(model, train, val, seed=seed, checkpoint=checkpoint, **options)


def _arrays(artifact) -> list[np.ndarray]:
    return [np.asarray(a) for a in jax.tree.leaves(eqx.filter(artifact.model.model, eqx.is_array))]


def _identical(a, b) -> None:
    for x, y in zip(_arrays(a), _arrays(b), strict=True):
        np.testing.assert_array_equal(x, y)
    assert a.history.to_json() == b.history.to_json()


@pytest.fixture(scope="module")
def group_run():
    return SeedGroup(loop(), seeds=SEEDS).run()


def test_sequential_members_are_their_single_runs_to_the_bit():
    # `group_step="sequential"` (the CPU's default): each member's own compiled step
    seeds = SEEDS[:2]
    group = SeedGroup(loop(group_step="sequential", steps=10), seeds=seeds).run()
    for s, member in zip(seeds, group, strict=True):
        _identical(member, loop(s, steps=10).run())
    assert (
        jax.default_backend() != "cpu"
        or Equinox().group_backend(SeedGroup(loop(group_step="auto"), seeds=seeds).plans).vectorize
        is False
    )


def test_bad_group_step_is_refused():
    with pytest.raises(ConfigError, match="group_step"):
        Equinox(group_step="parallel")


def test_each_member_equals_its_single_run(group_run):
    # own weights, data order and dropout keys: member s is TrainingLoop(seed=s) with the
    # model built under seed s, equal within float reordering (vmapped matmuls)
    for s, member in zip(SEEDS, group_run, strict=True):
        single = loop(s, group_step="auto").run()
        assert member.plan["seed"] == s and member.plan["model"]["seed"] == s
        for x, y in zip(_arrays(member), _arrays(single), strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(member.history["loss"], single.history["loss"], rtol=1e-4)
        np.testing.assert_allclose(
            member.history["val_loss"], single.history["val_loss"], rtol=1e-4
        )
    assert not np.allclose(_arrays(group_run[0])[0], _arrays(group_run[1])[0])


def test_resume_is_exact_when_members_died_between_commits(tmp_path, group_run):
    root = tmp_path / "group"
    SeedGroup(loop(directory=root), seeds=SEEDS).run()
    # as if killed between the members' commits: member 9 lost its last two checkpoints,
    # member 4 its last one; the group resumes at 30, 20 and 10 and catches up
    for seed, lost, latest in ((9, (20, 30), 10), (4, (30,), 20)):
        policy = Checkpoint(root / f"seed-{seed}")
        for step in lost:
            shutil.rmtree(policy.step_location(step))
        assert open_store(policy).latest_committed() == latest
    resumed = SeedGroup(loop(directory=root), seeds=SEEDS).run()
    assert [a.resumed_from_step for a in resumed] == [30, 20, 10]
    for a, b in zip(resumed, group_run, strict=True):
        _identical(a, b)
    # a member's directory is its single run's: it resumes as one (nothing left to do)
    alone = loop(9, directory=root / "seed-9").run()
    assert alone.resumed_from_step == STEPS
    _identical(alone, resumed[2])


def test_diverted_rollout_members_equal_their_single_runs():
    # the solver in the loop (the reference stepper) and the rollout noise per member
    from pipekit_train.core.testing import GOLDEN_ROLLOUTS, golden_rollout_task

    train, val = golden_rollout_task()
    base = {
        "rollout": GOLDEN_ROLLOUTS["diverted_k4"],
        "normalizer": train.normalizer(),
        "optimizer_config": {"name": "adam", "lr": 1e-3},
        "batch_size": 8,
        "max_steps": 4,
        "progress": False,
        "adapter": Equinox(group_step="vmap"),
    }
    op = EquinoxModelOp("pipekit_train.equinox.testing:mlp", in_size=2, out_size=2, width=16)
    group = SeedGroup(TrainingLoop(op, train, val, **base), seeds=[0, 1]).run()
    for s in (1,):  # the member whose seed is not the loop's
        single = TrainingLoop(op.with_seed(s), train, val, seed=s, **base).run()
        np.testing.assert_allclose(group[s].history["loss"], single.history["loss"], rtol=1e-4)
        np.testing.assert_allclose(
            group[s].history["val_loss"], single.history["val_loss"], rtol=1e-4
        )


def _odd_width(*, key, in_size: int, out_size: int):
    # a different network for another seed (PRNGKey(s) holds s): a group cannot stack it
    width = 8 if int(np.asarray(key)[-1]) % 2 else 16
    return eqx.nn.MLP(in_size, out_size, width, 1, key=key)


def test_members_with_different_networks_are_refused(tmp_path):
    train, _ = regression_task()
    op = EquinoxModelOp(_odd_width, in_size=4, out_size=1)
    assert op.with_seed(1).model.width_size != op.with_seed(2).model.width_size
    group = SeedGroup(
        TrainingLoop(op, train, max_steps=2, progress=False, checkpoint=tmp_path / "g"),
        seeds=[1, 2],
    )
    with pytest.raises(ConfigError, match="must build the same network"):
        group.run()
    assert not (tmp_path / "g").exists()


@pytest.mark.slow  # a subprocess of jax and five seeds checkpointing (~12 s)
def test_a_killed_five_seed_group_resumes_exactly(tmp_path):
    root = tmp_path / "group"
    seeds, steps = [0, 1, 2, 3, 4], 40
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    worker = subprocess.Popen(
        [sys.executable, str(HERE / "seed_group_kill_worker.py"), str(root), str(steps)],
        env=env,
    )
    try:  # SIGKILL as soon as some member has committed a checkpoint past step 10
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and worker.poll() is None:
            latest = [open_store(Checkpoint(root / f"seed-{s}")).latest_committed() for s in seeds]
            if any(step is not None and step > 10 for step in latest):
                break
            time.sleep(0.05)
        assert worker.poll() is None, "the worker ended before it was killed"
        worker.send_signal(signal.SIGKILL)
        worker.wait(30)
    finally:
        worker.kill()
    killed_at = [open_store(Checkpoint(root / f"seed-{s}")).latest_committed() for s in seeds]
    assert all(step is None or step < steps for step in killed_at)
    resumed = SeedGroup(loop(steps=steps, directory=root), seeds=seeds).run()
    uninterrupted = SeedGroup(loop(steps=steps), seeds=seeds).run()
    for a, b in zip(resumed, uninterrupted, strict=True):
        assert a.resumed_from_step is not None or a.steps == steps
        for x, y in zip(_arrays(a), _arrays(b), strict=True):
            np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(a.history["loss"], b.history["loss"])
