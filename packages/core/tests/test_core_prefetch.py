"""Prefetching in the step loop: the same batches, the same order, the same resume."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipekit_train.core import Checkpoint, TrainingLoop
from pipekit_train.core.data import ArrayDataset
from pipekit_train.core.run._feed import Feed
from pipekit_train.core.run._prefetch import Prefetcher
from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp


def _data(n: int = 96) -> ArrayDataset:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    return ArrayDataset(x=x, y=x @ np.array([[1.0], [-2.0], [0.5]], np.float32))


def _loop(prefetch: int, *, checkpoint: Any = None, max_steps: int = 40, **kw: Any) -> TrainingLoop:
    return TrainingLoop(
        model=NumpyLinearOp("pipekit_train.core.testing:linear", in_size=3, out_size=1),
        data=_data(),
        loss="mse",
        optimizer_config={"name": "adam", "lr": 0.05},
        batch_size=16,
        max_steps=max_steps,
        checkpoint=checkpoint,
        adapter=NumpyAdapter(gradient_noise=0.01, prefetch=prefetch),
        progress=False,
        **kw,
    )


@pytest.mark.parametrize("depth", [1, 2, 5])
def test_prefetching_trains_on_the_same_batches(depth: int) -> None:
    plain = _loop(0).run()
    ahead = _loop(depth).run()
    assert ahead.weights_sha256 == plain.weights_sha256
    assert ahead.history["loss"] == plain.history["loss"]


def test_a_checkpoint_saves_the_position_of_the_last_batch_trained(tmp_path: Path) -> None:
    whole = _loop(0, max_steps=40).run()
    first = _loop(3, checkpoint=Checkpoint(tmp_path / "ck", every_n_steps=7), max_steps=19).run()
    assert first.steps == 19
    # the prefetching thread read past step 19; the resume continues after the batch of step 19
    rest = _loop(3, checkpoint=Checkpoint(tmp_path / "ck", every_n_steps=7), max_steps=40).run()
    assert rest.resumed_from_step == 19
    assert rest.weights_sha256 == whole.weights_sha256


def test_a_data_error_surfaces_in_the_training_thread() -> None:
    class Failing:
        def __init__(self) -> None:
            self.n = 0

        def __next__(self) -> dict[str, np.ndarray]:
            self.n += 1
            if self.n == 3:
                raise ValueError("the third batch is bad")
            return {"x": np.full(2, self.n)}

    feed = Feed(Failing(), track=True)
    ahead = Prefetcher(feed, lambda group: group[0]["x"][0], size=1, depth=2)
    assert [next(ahead), next(ahead)] == [1, 2]
    with pytest.raises(ValueError, match="third batch"):
        next(ahead)
    ahead.close()


def test_closing_stops_the_thread() -> None:
    feed = Feed(iter({"x": np.zeros(1)} for _ in range(10**9)), track=True)
    ahead = Prefetcher(feed, lambda group: group, size=4, depth=2)
    next(ahead)
    ahead.close()
    assert not any(t.name == "pipekit-prefetch" and t.is_alive() for t in threading.enumerate())
    # what the thread read ahead is known to the feed: the position after any batch handed out
    assert feed.state_after(feed.produced) is None  # a plain iterator has no position


def test_a_feed_that_did_not_track_refuses_a_position_it_does_not_know() -> None:
    feed = Feed(iter([{"x": 1}, {"x": 2}]), track=False)
    next(feed)
    next(feed)
    with pytest.raises(RuntimeError, match="lost the data position"):
        feed.state_after(1)


def test_prefetching_is_chosen_only_for_batches_large_enough_to_pay() -> None:
    from types import SimpleNamespace

    from pipekit_train.core.adapter import prefetch_depth
    from pipekit_train.core.run._prefetch import PREFETCH_MIN_BYTES

    def plan(features: int, batch_size: int, accumulate: int = 1, data: Any = None) -> Any:
        if data is None:
            data = ArrayDataset(x=np.zeros((4, features), np.float32), y=np.zeros((4, 1)))
        return SimpleNamespace(data=data, batch_size=batch_size, accumulate_grad_batches=accumulate)

    # a sample of 8 float32 features and one float64 target: 40 bytes
    rows = -(-PREFETCH_MIN_BYTES // 40)  # the fewest rows that reach the bound
    assert prefetch_depth(plan(8, rows)) == 2  # just enough bytes per update
    assert prefetch_depth(plan(8, rows - 1)) == 0
    assert prefetch_depth(plan(8, 256)) == 0  # the small batches of most examples
    assert prefetch_depth(plan(8, rows // 4 + 1, accumulate=4)) == 2  # micro-batches add up
    assert prefetch_depth(plan(8, rows // 10 + 1), steps_per_execution=10, depth=3) == 3
    # a dataset that does not say its sample size keeps the backend's depth
    assert prefetch_depth(plan(8, 1, data=object()), depth=2) == 2
