"""The Ray Train half every backend shares (`core.utils`), against a stand-in `ray.train`.

No Ray runtime starts here: `ray.train` is replaced by a small module that records what
the worker reports. The adapters' tests (`test_lightning_ray.py`, `test_equinox_ray.py`)
run the real thing on a local Ray runtime.
"""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from pipekit_train.core import ConfigError, TrainingLoop
from pipekit_train.core.adapter import check_ray_fit, ray_train_worker
from pipekit_train.core.testing import NumpyLinearOp, regression_task
from pipekit_train.core.train._ray_train import RayTrainReport


class _Context:
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def get_world_rank(self) -> int:
        return self.rank

    def get_experiment_name(self) -> str:
        return "run-42"


class _Checkpoint:
    def __init__(self, files: dict[str, str]) -> None:
        self.files = files

    @classmethod
    def from_directory(cls, path: str) -> _Checkpoint:  # read now: the folder goes away
        return cls({p.name: p.read_text() for p in Path(path).iterdir()})


@pytest.fixture
def fake_train(monkeypatch: pytest.MonkeyPatch) -> Any:
    module = types.ModuleType("ray.train")
    module.reports = []  # type: ignore[attr-defined]
    module.rank = 0  # type: ignore[attr-defined]
    module.get_context = lambda: _Context(module.rank)  # type: ignore[attr-defined]
    module.Checkpoint = _Checkpoint  # type: ignore[attr-defined]

    def report(metrics: dict[str, Any], checkpoint: Any = None) -> None:
        module.reports.append((dict(metrics), checkpoint))  # type: ignore[attr-defined]

    module.report = report  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray.train", module)
    monkeypatch.delenv("PIPEKIT_TRAIN_JOB_ID", raising=False)
    return module


def _loop(tmp_path: Path) -> TrainingLoop:
    train, _ = regression_task()
    return TrainingLoop(
        model=NumpyLinearOp(
            "pipekit_train.core.testing._numpy_model:linear", in_size=4, out_size=1
        ),
        data=train,
        batch_size=16,
        max_steps=6,
        checkpoint=str(tmp_path / "ckpt"),
        progress=False,
    )


def test_the_worker_reports_each_checkpoint_and_takes_the_run_name_as_job_id(
    tmp_path: Path, fake_train: Any
) -> None:
    from pipekit_train.core import Checkpoint

    policy = Checkpoint(tmp_path / "ckpt", every_n_steps=3)
    train, _ = regression_task()

    def make_loop() -> TrainingLoop:
        return TrainingLoop(
            model=NumpyLinearOp(
                "pipekit_train.core.testing._numpy_model:linear", in_size=4, out_size=1
            ),
            data=train,
            batch_size=16,
            max_steps=6,
            checkpoint=policy,
            progress=False,
        )

    artifact = ray_train_worker(make_loop)
    assert os.environ["PIPEKIT_TRAIN_JOB_ID"] == "ray-train:run-42"
    assert artifact.steps == 6
    saved = [(m, c) for m, c in fake_train.reports if "done" not in m]
    assert [m["step"] for m, _ in saved] == [3, 6]
    for metrics, marker in saved:
        location = policy.step_location(metrics["step"])
        assert metrics["pipekit_checkpoint"] == location and "loss" in metrics
        assert json.loads(marker.files[RayTrainReport.MARKER]) == {
            "step": metrics["step"],
            "pipekit_checkpoint": location,
        }
    end, no_marker = fake_train.reports[-1]
    assert end["done"] == 1 and end["step"] == 6 and no_marker is None


def test_only_worker_zero_attaches_the_marker(fake_train: Any) -> None:
    fake_train.rank = 1
    state = types.SimpleNamespace(step=4, metrics={"loss": 0.5, "note": object()})
    RayTrainReport().on_checkpoint(state, "/ckpt/4")
    ((metrics, checkpoint),) = fake_train.reports
    assert checkpoint is None
    assert metrics == {"loss": 0.5, "step": 4, "pipekit_checkpoint": "/ckpt/4"}  # no objects


def test_the_factory_must_build_a_loop(tmp_path: Path, fake_train: Any) -> None:
    with pytest.raises(ConfigError, match="Received: loop_factory\\(\\) -> int"):
        ray_train_worker(lambda: 3)
    with pytest.raises(ConfigError, match="not a loop"):
        check_ray_fit(_loop(tmp_path), 2, 0)
    with pytest.raises(ConfigError, match="Received: num_workers=True"):
        check_ray_fit(lambda: None, True, 0)
    assert fake_train.reports == []
