"""`on_nonfinite="skip"` on this process's Keras backend (jax here; torch in the
backend-matrix subprocess): the update of a NaN batch is dropped, weights, optimizer
state and `iterations` included. Fused steps: tests-integration/test_nonfinite_backends.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipekit_train.core import Checkpoint, NonFiniteLossError, TrainingLoop
from pipekit_train.core.checkpoint import step_dirs
from pipekit_train.core.data import ArrayDataset
from pipekit_train.keras import Keras, KerasModelOp

BATCH = 8


def data(accumulate: int, nan_steps: tuple[int, ...], drop_step: int | None = None) -> Any:
    """Rows in order; a NaN in the first batch of each step of `nan_steps` (1-based)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((320, 4)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True).astype(np.float32)
    per_step = BATCH * accumulate
    for step in nan_steps:
        x[(step - 1) * per_step] = np.nan
    if drop_step is not None:
        keep = np.r_[: (drop_step - 1) * per_step, drop_step * per_step : len(x)]
        x, y = x[keep], y[keep]
    return ArrayDataset(x=x, y=y)


def loop(accumulate: int, dataset: Any, **kwargs: Any) -> TrainingLoop:
    return TrainingLoop(
        model=KerasModelOp("pipekit_train.keras.testing:linear", in_size=4, out_size=1),
        data=dataset,
        optimizer_config={"name": "adam", "lr": 0.01},
        batch_size=BATCH,
        accumulate_grad_batches=accumulate,
        shuffle=False,
        on_nonfinite="skip",
        adapter=Keras(),
        progress=False,
        **kwargs,
    )


@pytest.mark.parametrize("accumulate", [1, 2])
def test_skip_drops_exactly_that_update(accumulate: int) -> None:
    skipped = loop(accumulate, data(accumulate, (4,)), max_steps=7).run()
    assert skipped.history.series("nonfinite_skipped") == ([4], [1.0])
    reference = loop(accumulate, data(accumulate, (), drop_step=4), max_steps=6).run()
    losses = np.asarray(skipped.history["loss"])
    np.testing.assert_array_equal(np.delete(losses, 3), reference.history["loss"])
    assert skipped.model.serialize_weights() == reference.model.serialize_weights()


def test_skip_stops_after_max_consecutive_skips(tmp_path: Path) -> None:
    policy = Checkpoint(tmp_path / "ck", every_n_steps=3, async_save=False)
    with pytest.raises(NonFiniteLossError, match="step 5") as info:
        loop(1, data(1, (4, 5)), max_steps=10, max_consecutive_skips=2, checkpoint=policy).run()
    assert info.value.consecutive == 2 and step_dirs(tmp_path / "ck") == [3]
