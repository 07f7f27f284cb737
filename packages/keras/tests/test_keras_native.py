"""`keras.utils.PyDataset` as native data on the Keras adapter: training, exact resume, refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest

from pipekit_train.core import Checkpoint, ConfigError, TrainingLoop
from pipekit_train.core.testing import regression_task
from pipekit_train.keras import Keras, KerasModelOp
from pipekit_train.keras._data import PyDatasetBatches

LINEAR = "pipekit_train.keras.testing:linear"


class Batches(keras.utils.PyDataset):
    """`(x, y)` batches of an ArrayDataset, reshuffled by `on_epoch_end` with a seeded RNG."""

    def __init__(self, ds: Any, batch_size: int = 16, shuffle: bool = True, seed: int = 0):
        super().__init__()
        self.x, self.y = ds.arrays["x"], ds.arrays["y"]
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.rng = np.random.default_rng(seed)
        self.order = np.arange(len(self.x))
        self.on_epoch_end()

    def __len__(self) -> int:
        return len(self.x) // self.batch_size

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        idx = self.order[i * self.batch_size : (i + 1) * self.batch_size]
        return self.x[idx], self.y[idx]

    def on_epoch_end(self) -> None:
        if self.shuffle:
            self.order = self.rng.permutation(len(self.x))


class _Crash:
    def __init__(self, at: int):
        self.at = at

    def on_step_end(self, state: Any) -> None:
        if state.step == self.at:
            raise RuntimeError(f"killed at step {self.at}")


def loop(**overrides: Any) -> TrainingLoop:
    train, val = regression_task(n_train=128)
    kwargs: dict[str, Any] = {
        "model": KerasModelOp(LINEAR, in_size=4, out_size=1),
        "data": Batches(train),
        "validation": Batches(val, shuffle=False),
        "loss": "mse",
        "optimizer_config": {"name": "adam", "lr": 0.05},
        "batch_size": 16,
        "max_steps": 40,
        "seed": 0,
        "adapter": Keras(),
        "progress": False,
    }
    kwargs.update(overrides)
    return TrainingLoop(**kwargs)


def test_trains_on_a_pydataset() -> None:
    art = loop(validate_every_n_steps=20).run()
    losses = art.history["loss"]
    assert losses[-1] < 0.3 * losses[0]  # 8 batches an epoch: 5 epochs
    assert art.final_metrics["val_loss"] < 0.3 * losses[0]
    assert len(art.history.series("val_loss")[0]) == 2


@pytest.mark.parametrize(
    "k",
    [
        1,
        pytest.param(
            3,
            marks=pytest.mark.skipif(
                keras.backend.backend() != "jax", reason="fused steps need the jax backend"
            ),
        ),
    ],
)
def test_killed_run_resumes_exactly(tmp_path: Path, k: int) -> None:
    def run(**kw: Any) -> Any:
        return loop(max_steps=20, validation=None, adapter=Keras(steps_per_execution=k), **kw)

    policy = Checkpoint(tmp_path, every_n_steps=5, async_save=False)
    with pytest.raises(RuntimeError, match="killed at step 13"):
        run(checkpoint=policy, callbacks=[_Crash(13)]).run()
    resumed = run(checkpoint=policy).run()
    reference = loop(max_steps=20, validation=None).run()
    assert resumed.resumed_from_step == 10  # epoch 1, batch 2 (a reshuffled epoch)
    assert resumed.model.serialize_weights() == reference.model.serialize_weights()
    assert resumed.history["loss"] == reference.history["loss"]


def test_position_replays_the_epoch_hooks() -> None:
    train, _ = regression_task(n_train=64)
    it = PyDatasetBatches(Batches(train))
    for _ in range(10):  # 4 batches an epoch: into epoch 2
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    assert state == {"epoch": 2, "index": 2}
    expected = [next(it)["x"] for _ in range(4)]
    again = PyDatasetBatches(Batches(train), state)
    for want in expected:
        np.testing.assert_array_equal(next(again)["x"], want)


class _Triples(Batches):
    def __getitem__(self, i: int) -> Any:
        x, y = super().__getitem__(i)
        return x, y, np.ones(len(y))


def test_bad_native_data_is_refused_before_any_work() -> None:
    train, _ = regression_task(n_train=64)
    with pytest.raises(ConfigError, match="Received: data=list"):
        loop(data=[train[i] for i in range(4)])
    with pytest.raises(ConfigError, match="Received: element=tuple of 3"):
        loop(data=_Triples(train))
    with pytest.raises(ConfigError, match="max_epochs"):
        loop(max_steps=None, max_epochs=2)
