"""torchdata's `StatefulDataLoader` on `Lightning()`: its position in pipekit checkpoints."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pipekit_train.core import Checkpoint, ConfigError, TrainingLoop
from pipekit_train.core.testing import run_python
from pipekit_train.lightning import Lightning, TorchModelOp
from pipekit_train.lightning._stateful import (
    decode_loader_state,
    encode_loader_state,
    loader_position,
    restore_generators,
)

stateful_dataloader = pytest.importorskip("torchdata.stateful_dataloader")
StatefulDataLoader = stateful_dataloader.StatefulDataLoader

HERE = Path(__file__).parent
# the kill-and-resume workers fork from a server that imported these
WORKER_PRELOAD = ("lightning.pytorch", "pipekit_train.lightning", "pipekit_train.core.testing")


def _loader(n: int = 40, seed: int = 0, num_workers: int = 0) -> Any:
    x = torch.arange(n, dtype=torch.float32).reshape(n, 1)
    return StatefulDataLoader(
        torch.utils.data.TensorDataset(x, x),
        batch_size=8,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
        num_workers=num_workers,
    )


def _rows(batches: Any) -> list[list[float]]:
    return [b[0].reshape(-1).tolist() for b in batches]


@pytest.mark.parametrize("workers", [0, 2])
def test_position_round_trips_through_json_and_the_next_epoch_matches(workers: int) -> None:
    reference = _loader(num_workers=workers)
    ref_epochs = [_rows(reference) for _ in range(3)]
    # stop after 2 batches of the second epoch, save the position as JSON text
    first = _loader(num_workers=workers)
    _rows(first)
    it = iter(first)
    taken = _rows([next(it), next(it)])
    text = json.dumps(loader_position(first, epoch=1))
    position = json.loads(text)
    assert position["epoch"] == 1 and position["kind"] == "torch-loader-state"
    # a fresh loader (its generator seeded as at the start) continues at batch 3
    resumed = _loader(num_workers=workers)
    resumed.load_state_dict(decode_loader_state(position["state"]))
    rest = _rows(iter(resumed))
    restore_generators(resumed, position["generators"])
    assert taken + rest == ref_epochs[1]
    assert _rows(resumed) == ref_epochs[2]  # the following epoch's permutation too


def test_tensor_dtypes_and_key_types_survive_the_encoding() -> None:
    state = {
        "gen": torch.Generator().manual_seed(3).get_state(),
        "f": torch.tensor([[1.5, -2.0]], dtype=torch.float64),
        "b": torch.tensor([True, False]),
        "empty": torch.zeros((0, 3)),
        "by_worker": {0: {"yielded": 4}, 1: {"yielded": 5}},
        "pair": (1, None),
        "flag": True,
    }
    back = decode_loader_state(json.loads(json.dumps(encode_loader_state(state))))
    assert torch.equal(back["gen"], state["gen"]) and back["gen"].dtype == torch.uint8
    assert torch.equal(back["f"], state["f"]) and back["f"].dtype == torch.float64
    assert torch.equal(back["b"], state["b"])
    assert back["empty"].shape == (0, 3)
    assert back["by_worker"] == {0: {"yielded": 4}, 1: {"yielded": 5}}
    assert back["pair"] == (1, None) and back["flag"] is True


class OpaqueState(StatefulDataLoader):
    """A loader whose state holds an object JSON cannot represent."""

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": {"rng": np.random.default_rng(0)}}


def test_an_unserialisable_state_is_refused_naming_where_it_is() -> None:
    with pytest.raises(ConfigError, match=r"Generator at 'state/sampler/rng'.*data=OpaqueState"):
        encode_loader_state(OpaqueState(range(4)).state_dict(), loader=OpaqueState(range(4)))
    with pytest.raises(ConfigError, match=r"bytes at 'state/blob'"):
        encode_loader_state({"blob": b"\x00"})


def test_lightning_refuses_it_before_the_first_step(
    regression: Any, tmp_path: Path, lightning_module: Any
) -> None:
    train, _ = regression
    batch = train.get_batch(np.arange(len(train)))
    data = OpaqueState(
        torch.utils.data.TensorDataset(torch.from_numpy(batch["x"]), torch.from_numpy(batch["y"])),
        batch_size=16,
    )
    loop = TrainingLoop(
        model=TorchModelOp("pipekit_train.lightning.testing:linear", in_size=4, out_size=1),
        data=data,
        max_steps=4,
        checkpoint=Checkpoint(tmp_path / "ck", every_n_steps=1, async_save=False),
        adapter=Lightning(accelerator="cpu"),
        progress=False,
    )
    with pytest.raises(ConfigError, match="cannot be saved without pickle"):
        loop.run()
    assert not list((tmp_path / "ck").glob("**/meta.json"))  # nothing trained or saved


# 16 batches per epoch. "stateful": killed at step 27, resumed mid-way through the second
# epoch (step 18 or 24); "datamodule": killed at 19, resumed at 16 (the end of the first
# epoch). Both run on through the next epoch's start to step 40.
KILLS = {"stateful": (6, 27, (18, 24), 1), "datamodule": (8, 19, (16,), 0)}


@pytest.mark.slow
@pytest.mark.parametrize("data", list(KILLS))
def test_sigkill_and_resume_is_bit_identical(data: str, tmp_path: Path, torch_worker: Any) -> None:
    every, kill_at, resumed_at, epoch = KILLS[data]
    spec = {
        "backend": "lightning",
        "data": data,
        "adapter": {},
        "optimizer_config": {"name": "adam", "lr": 0.01},
        "max_steps": 40,
        "every_n_steps": every,
        "kill_at": kill_at,
        "directory": str(tmp_path / "ck"),
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    proc = run_python(
        [str(HERE / "torch_worker.py"), str(path)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        preload=WORKER_PRELOAD,
    )
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-3000:])
    resumed = torch_worker.build(spec, kill_at=None).run()
    step = resumed.resumed_from_step
    assert step in resumed_at
    (meta_path,) = (tmp_path / "ck").glob(f"**/{step}/meta.json")
    position = json.loads(meta_path.read_text())["data_iter"]
    assert position["kind"] == "torch-loader-state" and position["epoch"] == epoch
    reference = torch_worker.build({**spec, "directory": None}, kill_at=None).run()
    assert resumed.model.serialize_weights() == reference.model.serialize_weights()
    assert list(resumed.history["loss"]) == list(reference.history["loss"])
