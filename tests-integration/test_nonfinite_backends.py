"""The default `on_nonfinite="stop"` on every backend (fused steps and accumulation too).

A NaN in the batch of step 11 makes that step's loss NaN: the run stops with
`NonFiniteLossError` naming step 11, and the newest checkpoint on disk is from before it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipekit_train.core import Checkpoint, NonFiniteLossError, TrainingLoop
from pipekit_train.core.adapter import step_dirs
from pipekit_train.core.data import ArrayDataset

BATCH = 8


def _data(accumulate: int) -> ArrayDataset:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((640, 4)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True).astype(np.float32)
    x[10 * BATCH * accumulate] = np.nan  # the first batch of step 11
    return ArrayDataset(x=x, y=y)


def _setup(backend: str) -> tuple[Any, Any]:
    if backend == "equinox":
        from pipekit_train.equinox import Equinox, EquinoxModelOp

        op = EquinoxModelOp("pipekit_train.equinox.testing:linear", in_size=4, out_size=1)
        return op, Equinox(steps_per_execution=3)
    if backend == "lightning":
        from pipekit_train.lightning import Lightning, LightningModelOp

        op = LightningModelOp("pipekit_train.lightning.testing:linear", in_size=4, out_size=1)
        return op, Lightning(accelerator="cpu")
    from pipekit_train.keras import Keras, KerasModelOp

    op = KerasModelOp("pipekit_train.keras.testing:linear", in_size=4, out_size=1)
    return op, Keras(steps_per_execution=3)


@pytest.mark.parametrize("accumulate", [1, 2])
@pytest.mark.parametrize("backend", ["equinox", "lightning", "keras"])
def test_nan_stops_before_it_is_checkpointed(tmp_path: Path, backend: str, accumulate: int) -> None:
    model, adapter = _setup(backend)
    policy = Checkpoint(tmp_path / "ck", every_n_steps=4, max_to_keep=2, async_save=False)
    loop = TrainingLoop(
        model=model,
        data=_data(accumulate),
        optimizer_config={"name": "sgd", "lr": 0.01},
        batch_size=BATCH,
        accumulate_grad_batches=accumulate,
        max_steps=30,
        shuffle=False,
        checkpoint=policy,
        adapter=adapter,
        progress=False,
    )
    with pytest.raises(NonFiniteLossError, match="step 11"):
        loop.run()
    assert step_dirs(tmp_path / "ck") == [4, 8]
