"""`Torch()` with prefetching (on by itself on CUDA): the same batches and weights as without.

On the CPU the tests switch it on by hand; the thread then puts every batch on the device
ahead and fused steps take the prefetched batches as a list (`TorchStepBackend.stack`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipekit_train.core import Checkpoint, TrainingLoop
from pipekit_train.core.testing import regression_task
from pipekit_train.lightning import Torch, TorchModelOp, _step_backend


def _loop(**overrides: Any) -> TrainingLoop:
    train, val = regression_task()
    kwargs: dict[str, Any] = {
        "model": TorchModelOp("pipekit_train.lightning.testing:mlp", in_size=4, out_size=1),
        "data": train,
        "validation": val,
        "optimizer_config": {"name": "adam", "lr": 1e-2},
        "batch_size": 16,
        "max_steps": 30,
        "progress": False,
    }
    kwargs.update(overrides)
    return TrainingLoop(**kwargs)


def _prefetch_two(patch: pytest.MonkeyPatch) -> None:
    init = _step_backend.TorchStepBackend.__init__

    def patched(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.prefetch = 2

    patch.setattr(_step_backend.TorchStepBackend, "__init__", patched)


@pytest.mark.parametrize(
    "options",
    [
        {"adapter": Torch()},
        {"adapter": Torch(steps_per_execution=10)},
        {"adapter": Torch(steps_per_execution=10), "accumulate_grad_batches": 2},
    ],
    ids=["k1", "k10", "k10-accumulate"],
)
def test_prefetching_trains_on_the_same_batches(
    options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = _loop(**options).run()
    with monkeypatch.context() as patch:
        _prefetch_two(patch)
        ahead = _loop(**options).run()
    assert ahead.weights_sha256 == plain.weights_sha256
    assert ahead.history["loss"] == plain.history["loss"]


def test_a_prefetching_run_resumes_exactly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _prefetch_two(monkeypatch)
    adapter = {"adapter": Torch(steps_per_execution=4)}
    whole = _loop(max_steps=40, **adapter).run()
    policy = dict(every_n_steps=8, async_save=False)
    first = _loop(max_steps=24, checkpoint=Checkpoint(tmp_path / "ck", **policy), **adapter)
    assert first.run().steps == 24
    rest = _loop(max_steps=40, checkpoint=Checkpoint(tmp_path / "ck", **policy), **adapter).run()
    assert rest.resumed_from_step == 24 and rest.weights_sha256 == whole.weights_sha256


def test_large_fused_groups_reach_the_step_as_prefetched_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pipekit_train.core.train import _step_loop

    options = {"adapter": Torch(steps_per_execution=10), "accumulate_grad_batches": 2}
    plain = _loop(**options).run()
    _prefetch_two(monkeypatch)
    monkeypatch.setattr(_step_loop, "_DEVICE_STACK_BYTES", 0)  # every group counts as large
    seen: list[int] = []
    train_steps = _step_backend.TorchStepBackend.train_steps

    def spy(self: Any, state: Any, stacked: Any) -> Any:
        if isinstance(stacked, list):
            seen.append(len(stacked))
        return train_steps(self, state, stacked)

    monkeypatch.setattr(_step_backend.TorchStepBackend, "train_steps", spy)
    ahead = _loop(**options).run()
    assert seen and all(n % 2 == 0 for n in seen)
    assert ahead.weights_sha256 == plain.weights_sha256
