"""`on_nonfinite`: a NaN loss stops the run by default, before anything is checkpointed;
`"skip"` drops the update of a non-finite step and stops after too many in a row."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipekit_train.core import (
    Checkpoint,
    ConfigError,
    NonFiniteLossError,
    NotSupportedError,
    TrainingLoop,
)
from pipekit_train.core.adapter import Capabilities
from pipekit_train.core.checkpoint import step_dirs
from pipekit_train.core.data import ArrayDataset
from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp
from pipekit_train.core.writers import MemoryWriter

BATCH = 8


def data(nan_at_step: int | None | tuple[int, ...], drop_step: int | None = None) -> ArrayDataset:
    """512 samples in order; the batch of step `nan_at_step` (1-based) holds a NaN.

    `drop_step`: leave out the batch of that step (the data a skipped step amounts to).
    """
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 3)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5]], np.float32)).astype(np.float32)
    steps = () if nan_at_step is None else np.atleast_1d(nan_at_step)
    for step in steps:
        x[(int(step) - 1) * BATCH] = np.nan
    if drop_step is not None:
        keep = np.r_[: (drop_step - 1) * BATCH, drop_step * BATCH : len(x)]
        x, y = x[keep], y[keep]
    return ArrayDataset(x=x, y=y)


def loop(nan_at_step: int | None | tuple[int, ...], **overrides: Any) -> TrainingLoop:
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


ADAM = {"name": "adam", "lr": 0.05}


def test_skip_drops_the_update_as_if_the_batch_were_not_there() -> None:
    skipped = loop(5, on_nonfinite="skip", optimizer_config=ADAM).run()
    assert skipped.steps == 40 and math.isnan(skipped.history["loss"][4])
    assert skipped.history.series("nonfinite_skipped") == ([5], [1.0])
    assert skipped.final_metrics["nonfinite_skipped"] == 1.0
    # Adam's moments and step count are untouched: the same bytes as 39 steps on the data
    # without that batch (an applied update would have made every weight NaN)
    without = loop(None, data=data(None, drop_step=5), max_steps=39, optimizer_config=ADAM).run()
    assert skipped.model.serialize_weights() == without.model.serialize_weights()
    losses = np.asarray(skipped.history["loss"])
    np.testing.assert_array_equal(np.delete(losses, 4), without.history["loss"])


def test_skip_stops_after_max_consecutive_skips(tmp_path: Path) -> None:
    # two in a row are ridden through, the third stops the run naming it
    ok = loop((10, 11), on_nonfinite="skip", max_consecutive_skips=3).run()
    assert ok.history.series("nonfinite_skipped") == ([10, 11], [1.0, 2.0])
    policy = Checkpoint(tmp_path / "ck", every_n_steps=4, max_to_keep=2, async_save=False)
    with pytest.raises(
        NonFiniteLossError, match=r"step 15.*last of 3 consecutive skipped steps \(13\.\.15\)"
    ) as info:
        loop((13, 14, 15), on_nonfinite="skip", max_consecutive_skips=3, checkpoint=policy).run()
    assert info.value.step == 15 and info.value.consecutive == 3
    assert step_dirs(tmp_path / "ck") == [8, 12]  # 16 was never reached: the last good survive


def test_skip_postpones_a_checkpoint_due_on_a_skipped_step(tmp_path: Path) -> None:
    policy = Checkpoint(tmp_path / "ck", every_n_steps=4, max_to_keep=None, async_save=False)
    writer = MemoryWriter()
    art = loop((8, 9), on_nonfinite="skip", checkpoint=policy, max_steps=16, writers=[writer]).run()
    assert step_dirs(tmp_path / "ck") == [4, 10, 12, 16]  # 8 waited for the first finite step
    assert art.history.last("nonfinite_skipped") == 2.0
    # resuming from step 10 continues exactly, skip count included
    for step in (12, 16):
        (tmp_path / "ck" / str(step)).rename(tmp_path / f"moved-{step}")
    resumed = loop((8, 9), on_nonfinite="skip", checkpoint=policy, max_steps=16).run()
    assert resumed.resumed_from_step == 10
    assert resumed.model.serialize_weights() == art.model.serialize_weights()
    assert resumed.history.series("nonfinite_skipped") == ([8, 9], [1.0, 2.0])
    # the final checkpoint is not written from a skipped last step either
    last = Checkpoint(tmp_path / "last", every_n_steps=100, async_save=False)
    loop(16, on_nonfinite="skip", checkpoint=last, max_steps=16).run()
    assert step_dirs(tmp_path / "last") == []


def test_skip_options_are_validated_and_recorded() -> None:
    assert loop(None, on_nonfinite="skip").plan.to_json()["max_consecutive_skips"] == 10
    assert loop(None).plan.to_json()["max_consecutive_skips"] is None
    with pytest.raises(ConfigError, match=r"Received: max_consecutive_skips=0"):
        loop(None, on_nonfinite="skip", max_consecutive_skips=0)
    with pytest.raises(ConfigError, match=r"max_consecutive_skips=3, on_nonfinite='stop'"):
        loop(None, max_consecutive_skips=3)


def test_an_adapter_without_the_capability_refuses_skip() -> None:
    class NoSkip(NumpyAdapter):
        capabilities = Capabilities(online=True)

    with pytest.raises(NotSupportedError, match=r"Received: on_nonfinite='skip'"):
        loop(None, on_nonfinite="skip", adapter=NoSkip())
