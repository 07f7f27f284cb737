"""`SeedGroup` and core's group loop, on the numpy reference adapter (no backend)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from pipekit_train.core import (
    ArrayDataset,
    Checkpoint,
    ConfigError,
    SeedGroup,
    TrainingLoop,
)
from pipekit_train.core.checkpoint import open_store
from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp

SEEDS = [3, 0, 7]


def _data(n: int = 64) -> ArrayDataset:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.1).astype(np.float32)
    return ArrayDataset(x=x, y=y)


def _loop(tmp_path=None, *, seed: int = 0, directory=None, **kwargs) -> TrainingLoop:
    data = _data()
    checkpoint = None
    if directory is not None:
        checkpoint = Checkpoint(directory, every_n_steps=5, max_to_keep=3)
    options = {
        "optimizer_config": {"name": "adam", "lr": 0.05},
        "batch_size": 8,
        "max_steps": 23,
        "validate_every_n_steps": 10,
        "adapter": NumpyAdapter(gradient_noise=0.01),
        "progress": False,
    }
    options.update(kwargs)
    return TrainingLoop(
        NumpyLinearOp("pipekit_train.core.testing:linear", in_size=3, out_size=1, seed=seed),
        data,
        data,
        checkpoint=checkpoint,
        seed=seed,
        **options,
    )


def _weights(artifact) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in artifact.model.model.parameters().items()}


def _same(a, b, *, series=None) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        np.testing.assert_array_equal(wa[k], wb[k])
    ha, hb = a.history.to_json(), b.history.to_json()
    for name in series or sorted({*ha, *hb}):
        assert ha[name] == hb[name], name


@pytest.fixture(scope="module")
def singles():
    """Each member's single run (model seed and loop seed `s`)."""
    return {s: _loop(seed=s).run() for s in SEEDS}


def test_each_member_is_its_single_run(singles):
    group = SeedGroup(_loop(), seeds=SEEDS)
    artifacts = group.run()
    assert [a.plan["seed"] for a in artifacts] == SEEDS
    assert [a.plan["model"]["seed"] for a in artifacts] == SEEDS
    for s, artifact in zip(SEEDS, artifacts, strict=True):
        _same(artifact, singles[s])
        assert artifact.steps == 23 and "val_loss" in artifact.history.names
    # the members differ from each other (own weights, data order and noise)
    assert not np.array_equal(_weights(artifacts[0])["W"], _weights(artifacts[1])["W"])


def test_member_checkpoints_are_single_run_checkpoints(tmp_path, singles):
    root = tmp_path / "group"
    SeedGroup(_loop(directory=root), seeds=SEEDS[:2]).run()
    assert sorted(p.name for p in root.iterdir()) == ["seed-0", "seed-3"]
    # a member's directory resumes as the single run of its seed: nothing left to train
    resumed = _loop(seed=3, directory=root / "seed-3").run()
    assert resumed.resumed_from_step == 23
    _same(resumed, singles[3])


def test_resume_is_exact_when_members_died_at_different_steps(tmp_path, singles):
    root = tmp_path / "group"
    SeedGroup(_loop(directory=root), seeds=SEEDS).run()
    # kill simulated between commits: member 7 loses its last two checkpoints (steps 20
    # and 23), member 0 its last one, so the members restart at 15, 20 and 23
    for seed, lost, latest in ((7, (20, 23), 15), (0, (23,), 20)):
        policy = Checkpoint(root / f"seed-{seed}")
        for step in lost:
            shutil.rmtree(policy.step_location(step))
        assert open_store(policy).latest_committed() == latest
    again = SeedGroup(_loop(directory=root), seeds=SEEDS).run()
    assert [a.resumed_from_step for a in again] == [23, 20, 15]
    for s, artifact in zip(SEEDS, again, strict=True):
        _same(artifact, singles[s])


def test_time_budget_stops_every_member_at_one_step_and_resumes(tmp_path, singles):
    root = tmp_path / "group"
    first = SeedGroup(_loop(directory=root, max_time=1e-9), seeds=SEEDS).run()
    assert {a.stop_reason for a in first} == {"max_time"}
    assert len({a.steps for a in first}) == 1 and first[0].steps < 23
    rest = SeedGroup(_loop(directory=root), seeds=SEEDS).run()
    for s, artifact in zip(SEEDS, rest, strict=True):
        assert artifact.resumed_from_step == first[0].steps
        # the stopped run validated where it stopped, as a single run does
        _same(artifact, singles[s], series=["loss"])


@pytest.mark.parametrize(
    ("seeds", "match"),
    [
        ([0, 1, 0], "seed 0 appears more than once"),
        ([], "non-empty list"),
        ("012", "non-empty list"),
        ([0, -1], r"seeds\[1\]"),
        ([0, True], r"seeds\[1\]"),
    ],
)
def test_bad_seeds_are_refused(seeds, match):
    with pytest.raises(ConfigError, match=match):
        SeedGroup(_loop(), seeds=seeds)


def test_unsupported_options_are_refused_before_any_work(tmp_path):
    from pipekit_train.core import MemoryWriter

    root = tmp_path / "group"
    with pytest.raises(ConfigError, match="does not take `writers`"):
        SeedGroup(_loop(directory=root, writers=[MemoryWriter()]), seeds=[0, 1])
    with pytest.raises(ConfigError, match="accumulate"):
        SeedGroup(_loop(directory=root, accumulate_grad_batches=2), seeds=[0, 1])
    with pytest.raises(ConfigError, match="must be a TrainingLoop"):
        SeedGroup("loop", seeds=[0, 1])  # type: ignore[arg-type]
    assert not root.exists()


def test_a_backend_without_lockstep_trains_the_members_in_turn(tmp_path, singles):
    class Plain(NumpyAdapter):
        capabilities = NumpyAdapter.capabilities.__class__(online=True)

        def group_backend(self, plans):
            raise AssertionError("no lockstep without Capabilities.seed_groups")

    root = tmp_path / "group"
    artifacts = SeedGroup(
        _loop(adapter=Plain(gradient_noise=0.01), directory=root), seeds=SEEDS
    ).run()
    for s, artifact in zip(SEEDS, artifacts, strict=True):
        _same(artifact, singles[s])
        assert artifact.checkpoint_dir == str((root / f"seed-{s}").absolute())
