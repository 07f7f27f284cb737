"""The adapter-author walk-through: plain PyTorch through the contract, in one file.

`examples/plain_torch_adapter.py` implements only a `StepAdapter` and its `StepBackend`;
core's step driver gives it batching, validation, checkpoints, exact resume, callbacks
and writers. (Its loss curves are checked against Equinox's in `test_golden_runs.py`.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipekit_train.core import Checkpoint, ConfigError, NotSupportedError, TrainingLoop
from pipekit_train.core.adapter import step_dirs
from pipekit_train.core.callbacks import LambdaCallback
from pipekit_train.core.testing import regression_task
from pipekit_train.lightning import LightningModelOp

pytest.importorskip("torch")
from plain_torch_adapter import PlainTorch  # noqa: E402  (examples/ is on sys.path)


class Boom(RuntimeError):
    pass


def loop(**overrides: Any) -> TrainingLoop:
    train, val = regression_task()
    kwargs: dict[str, Any] = {
        "model": LightningModelOp("pipekit_train.lightning.testing:mlp", in_size=4, out_size=1),
        "data": train,
        "validation": val,
        "optimizer_config": {"name": "adamw", "lr": 0.02, "clip_norm": 1.0},
        "batch_size": 16,
        "max_steps": 20,
        "accumulate_grad_batches": 2,
        "validate_every_n_steps": 5,
        "adapter": PlainTorch(),
        "progress": False,
    }
    kwargs.update(overrides)
    return TrainingLoop(**kwargs)


def test_trains_and_resumes_exactly(tmp_path: Path) -> None:
    policy = Checkpoint(tmp_path / "ck", every_n_steps=5, max_to_keep=2, async_save=False)

    def crash(state: Any) -> None:
        if state.step == 13:
            raise Boom("killed")

    with pytest.raises(Boom):
        loop(checkpoint=policy, callbacks=[LambdaCallback(on_step_end=crash)]).run()
    assert step_dirs(tmp_path / "ck") == [5, 10]
    resumed = loop(checkpoint=policy).run()
    reference = loop().run()
    assert resumed.resumed_from_step == 10 and resumed.backend == "torch"
    assert resumed.model.serialize_weights() == reference.model.serialize_weights()
    losses = reference.history["loss"]
    assert len(losses) == 20 and losses[-1] < 0.5 * losses[0]
    assert reference.history.series("val_loss")[0] == [5, 10, 15, 20]


def test_capabilities_refuse_what_it_does_not_offer() -> None:
    with pytest.raises(NotSupportedError, match="not supported by the 'torch' backend"):
        loop(sharding="dp")
    with pytest.raises(ConfigError, match="keys the 'adamw' optimizer does not take"):
        loop(optimizer_config={"name": "adamw", "momentum": 0.9})
