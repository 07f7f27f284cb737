"""`as_supervised`, and a `SimulationDataset` with its default keys meeting `TrainingLoop`."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from pipekit_train.core import ConfigError, TrainingLoop
from pipekit_train.core.data import (
    ArrayDataset,
    CachedDataset,
    IterableDataset,
    SimulationDataset,
    as_supervised,
    split,
)
from pipekit_train.core.testing import NumpyLinearOp


def prior(rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, size=2).astype(np.float32)


def linear_sim(theta: np.ndarray) -> np.ndarray:
    """A linear simulator, so the numpy reference model can learn it either way round."""
    a = np.array([[1.0, 0.5, -1.0], [0.0, 2.0, 1.0]], dtype=np.float32)
    return theta @ a + np.float32(0.1)


def loop(data: object, in_size: int, out_size: int) -> TrainingLoop:
    return TrainingLoop(
        model=NumpyLinearOp(
            "pipekit_train.core.testing:linear", in_size=in_size, out_size=out_size
        ),
        data=data,
        optimizer_config={"name": "adam", "lr": 0.05},
        batch_size=16,
        max_steps=150,
        log_every_n_steps=10,
        progress=False,
    )


def test_default_keys_raise_the_one_line_fix_and_following_it_trains() -> None:
    data = SimulationDataset(linear_sim, prior, n=256, seed=0)  # keys ("theta", "x")
    with pytest.raises(ConfigError) as info:
        loop(data, in_size=2, out_size=3)
    message = str(info.value)
    assert "Received: keys=['theta', 'x']" in message
    emulator_fix = "data = as_supervised(data, input='theta', target='x')"
    inference_fix = "data = as_supervised(data, input='x', target='theta')"
    assert emulator_fix in message and inference_fix in message
    assert "pipekit_train.core.data" in message

    # follow the fix exactly as printed: both lines run and train
    for fix, sizes in ((emulator_fix, (2, 3)), (inference_fix, (3, 2))):
        namespace = {"data": data}
        exec(f"from pipekit_train.core.data import as_supervised\n{fix}", namespace)
        artifact = loop(namespace["data"], *sizes).run()
        losses = artifact.history["loss"]
        assert artifact.steps == 150 and losses[-1] < 0.05 * losses[0]


def test_validation_data_and_other_keys_get_the_fix_too() -> None:
    train = as_supervised(SimulationDataset(linear_sim, prior, n=64), input="theta", target="x")
    with pytest.raises(ConfigError, match=re.escape("validation = as_supervised(validation, ")):
        TrainingLoop(
            model=NumpyLinearOp("pipekit_train.core.testing:linear", in_size=2, out_size=3),
            data=train,
            validation=SimulationDataset(linear_sim, prior, n=16),
            max_steps=1,
        )
    other = ArrayDataset(obs=np.zeros((32, 3)), params=np.zeros((32, 2)))
    with pytest.raises(
        ConfigError, match=re.escape("data = as_supervised(data, input='obs', target='params')")
    ):
        loop(other, 3, 2)


def test_the_view_renames_two_keys_and_leaves_the_rest_out(tmp_path: Path) -> None:
    def sampler(rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"theta": prior(rng), "noise": rng.normal(size=3).astype(np.float32)}

    def sim(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"obs": linear_sim(params["theta"]) + params["noise"]}

    sims = SimulationDataset(sim, sampler, n=40, seed=3)
    view = as_supervised(sims, input="obs", target="theta")
    assert view.keys == ("x", "y") and len(view) == 40
    assert view.element_spec["x"].shape == (3,) and view.element_spec["y"].shape == (2,)
    np.testing.assert_array_equal(view[7]["x"], sims[7]["obs"])
    np.testing.assert_array_equal(view[7]["y"], sims[7]["theta"])
    batch = view.get_batch(np.array([3, 0, 7]))
    assert set(batch) == {"x", "y"}
    np.testing.assert_array_equal(batch["x"][2], sims[7]["obs"])

    # before or after `split`, and on a cache of the raw simulations
    train, _ = split(view, (0.75, 0.25), seed=0)
    raw_train, _ = split(sims, (0.75, 0.25), seed=0)
    np.testing.assert_array_equal(
        train.get_batch(np.arange(5))["x"],
        as_supervised(raw_train, input="obs", target="theta").get_batch(np.arange(5))["x"],
    )
    cache = CachedDataset.build(sims, tmp_path / "sims.zarr", chunk_size=16)
    cached_view = as_supervised(cache, input="obs", target="theta")
    np.testing.assert_array_equal(
        cached_view.get_batch(np.arange(40))["y"], view.get_batch(np.arange(40))["y"]
    )

    # the fingerprint follows the parent and the mapping
    assert view.fingerprint() == as_supervised(sims, input="obs", target="theta").fingerprint()
    assert view.fingerprint() != as_supervised(sims, input="theta", target="obs").fingerprint()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"input": "obs", "target": "x"},
            r"`input` must be one of the dataset's keys \['theta', 'x'\]. Received: input='obs'",
        ),
        ({"input": "x", "target": "x"}, r"must be different keys. Received: input='x', target='x'"),
        (
            {"input": 3, "target": "x"},
            r"`input` must be a sample key \(a string\). Received: input=3",
        ),
    ],
)
def test_bad_keys_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        as_supervised(SimulationDataset(linear_sim, prior, n=4), **kwargs)


def test_streams_are_refused_with_the_fix() -> None:
    stream = IterableDataset(lambda: iter([{"a": np.zeros(1), "b": np.zeros(1)}]))
    with pytest.raises(ConfigError, match="Yield samples"):
        as_supervised(stream, input="a", target="b")
