"""grain loaders as native data on the Equinox adapter: training, exact resume, refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grain
import numpy as np
import pytest

from pipekit_train.core import Checkpoint, ConfigError
from pipekit_train.equinox import Equinox
from pipekit_train.equinox._data import GrainBatches


def _samples(regression: tuple[Any, Any], part: int = 0) -> list[dict[str, np.ndarray]]:
    ds = regression[part]
    return [ds[i] for i in range(len(ds))]


def _map_ds(regression: tuple[Any, Any], part: int = 0) -> grain.MapDataset:
    src = grain.MapDataset.source(_samples(regression, part))
    if part == 0:
        src = src.shuffle(seed=7)
    return src.batch(16, drop_remainder=True)


def _iter_ds(regression: tuple[Any, Any]) -> grain.IterDataset:
    # a finite IterDataset (one epoch): the adapter starts it again for the next epoch
    return _map_ds(regression).to_iter_dataset(grain.ReadOptions(num_threads=0))


def _data_loader(regression: tuple[Any, Any]) -> grain.DataLoader:
    samples = _samples(regression)
    return grain.DataLoader(
        data_source=samples,
        sampler=grain.samplers.IndexSampler(
            num_records=len(samples), shuffle=True, seed=3, num_epochs=None
        ),
        operations=[grain.transforms.Batch(16, drop_remainder=True)],
        worker_count=0,
    )


_LOADERS = {"map": _map_ds, "iter": _iter_ds, "dataloader": _data_loader}


class _Crash:
    """Raises at the end of step `at` (a killed run)."""

    def __init__(self, at: int):
        self.at = at

    def on_step_end(self, state: Any) -> None:
        if state.step == self.at:
            raise RuntimeError(f"killed at step {self.at}")


@pytest.mark.parametrize("kind", ["map", "iter"])
def test_trains_on_grain_datasets(make_loop, regression, kind: str) -> None:
    art = make_loop(
        data=_LOADERS[kind](regression),
        validation=_map_ds(regression, part=1),
        max_steps=60,
        validate_every_n_steps=30,
    ).run()
    losses = art.history["loss"]
    assert losses[-1] < 0.2 * losses[0]  # 16 batches an epoch: epochs 1-3 repeat it
    assert art.final_metrics["val_loss"] < 0.2 * losses[0]
    assert len(art.history.series("val_loss")[0]) == 2


@pytest.mark.parametrize(
    "kind", [pytest.param("map", marks=pytest.mark.slow), "iter", "dataloader"]
)
def test_killed_run_resumes_exactly(make_loop, regression, tmp_path: Path, kind: str) -> None:
    def loop(**kw: Any) -> Any:
        return make_loop(data=_LOADERS[kind](regression), validation=None, max_steps=24, **kw)

    policy = Checkpoint(tmp_path, every_n_steps=6)
    with pytest.raises(RuntimeError, match="killed at step 21"):
        loop(checkpoint=policy, callbacks=[_Crash(21)]).run()  # past an epoch end (16)
    resumed = loop(checkpoint=policy).run()
    reference = loop().run()
    assert resumed.resumed_from_step == 18
    assert resumed.model.serialize_weights() == reference.model.serialize_weights()
    assert resumed.history["loss"] == reference.history["loss"]


def test_an_already_repeated_map_dataset(regression) -> None:
    once = GrainBatches(_map_ds(regression))
    repeated = GrainBatches(_map_ds(regression).repeat())
    for _ in range(20):
        np.testing.assert_array_equal(next(once)["x"], next(repeated)["x"])


def test_fused_steps_with_a_grain_loader(make_loop, regression) -> None:
    one = make_loop(data=_map_ds(regression), validation=None, max_steps=12).run()
    fused = make_loop(
        data=_map_ds(regression),
        validation=None,
        max_steps=12,
        adapter=Equinox(steps_per_execution=4),
    ).run()
    np.testing.assert_allclose(fused.history["loss"], one.history["loss"], rtol=1e-5)


@pytest.mark.parametrize("kind", ["map", "iter", "dataloader"])
def test_state_is_json_and_positions_a_new_iterator(regression, kind: str) -> None:
    batches = GrainBatches(_LOADERS[kind](regression))
    for _ in range(20):  # past the end of the first epoch
        next(batches)
    state = json.loads(json.dumps(batches.get_state()))
    expected = [next(batches)["x"] for _ in range(3)]
    again = GrainBatches(_LOADERS[kind](regression), state)
    for want in expected:
        np.testing.assert_array_equal(next(again)["x"], want)


def test_bad_native_data_is_refused_before_any_work(make_loop, regression) -> None:
    import torch

    with pytest.raises(ConfigError, match="Received: data=list"):
        make_loop(data=_samples(regression))
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2)
    with pytest.raises(ConfigError, match="Received: data=DataLoader"):
        make_loop(data=loader)
    unbatched = grain.MapDataset.source([{"a": np.zeros(4)}])
    with pytest.raises(ConfigError, match="'x'.*Received: element=\\['a'\\]"):
        make_loop(data=unbatched)
    with pytest.raises(ConfigError, match="max_epochs"):
        make_loop(data=_map_ds(regression), max_steps=None, max_epochs=2)
    with pytest.raises(ConfigError, match="validation MapDataset must be finite"):
        make_loop(data=_map_ds(regression), validation=_map_ds(regression, 1).repeat())
