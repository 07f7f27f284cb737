"""`on_nonfinite`: a NaN loss stops the run by default, before anything is checkpointed."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipekit_train.core import Checkpoint, ConfigError, NonFiniteLossError, TrainingLoop
from pipekit_train.core.adapter import step_dirs
from pipekit_train.core.data import ArrayDataset
from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp
from pipekit_train.core.writers import MemoryWriter

BATCH = 8


def data(nan_at_step: int | None) -> ArrayDataset:
    """512 samples in order; the batch of step `nan_at_step` (1-based) holds a NaN."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 3)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5]], np.float32)).astype(np.float32)
    if nan_at_step is not None:
        x[(nan_at_step - 1) * BATCH] = np.nan
    return ArrayDataset(x=x, y=y)


def loop(nan_at_step: int | None, **overrides: Any) -> TrainingLoop:
    kwargs: dict[str, Any] = {
        "model": NumpyLinearOp("pipekit_train.core.testing:linear", in_size=3, out_size=1),
        "data": data(nan_at_step),
        "optimizer_config": {"name": "sgd", "lr": 0.05},
        "batch_size": BATCH,
        "max_steps": 40,
        "shuffle": False,
        "log_every_n_steps": 7,
        "adapter": NumpyAdapter(),
        "progress": False,
    }
    kwargs.update(overrides)
    return TrainingLoop(**kwargs)


def test_default_stops_naming_the_step_and_keeps_the_last_good_checkpoint(
    tmp_path: Path,
) -> None:
    policy = Checkpoint(tmp_path / "ck", every_n_steps=4, max_to_keep=2, async_save=False)
    writer = MemoryWriter()
    with pytest.raises(NonFiniteLossError, match="step 23") as info:
        loop(23, checkpoint=policy, writers=[writer]).run()
    assert info.value.step == 23 and math.isnan(info.value.value)
    # the checkpoints at 24 (and later) were never written: 16 and 20 survive rotation
    assert step_dirs(tmp_path / "ck") == [16, 20]
    steps, losses = writer.series("loss")
    assert steps[-1] == 23 and math.isnan(losses[-1])  # the bad step is logged, then stop
    # the last good checkpoint resumes exactly: the same as an uninterrupted clean run
    resumed = loop(None, checkpoint=policy).run()
    assert resumed.resumed_from_step == 20
    reference = loop(None).run()
    assert resumed.model.serialize_weights() == reference.model.serialize_weights()


def test_ignore_trains_on() -> None:
    artifact = loop(5, on_nonfinite="ignore").run()
    losses = artifact.history["loss"]
    assert len(losses) == 40 and math.isnan(losses[4]) and math.isnan(losses[-1])


def test_policy_is_validated_and_recorded() -> None:
    with pytest.raises(ConfigError, match=r"Received: on_nonfinite='skipp'"):
        loop(None, on_nonfinite="skipp")
    assert loop(None).plan.to_json()["on_nonfinite"] == "stop"
