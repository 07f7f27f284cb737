"""Native loaders through the contract: `StepBackend.native_batches` in `run_step_loop`."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from pipekit_train.core import Checkpoint, ConfigError, TrainingLoop
from pipekit_train.core.adapter import Capabilities, Plan
from pipekit_train.core.checkpoint import step_dirs
from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp, regression_task
from pipekit_train.core.testing._numpy_adapter import _NumpyBackend


class Loader:
    """A toy native loader: a list of batch dicts."""

    def __init__(self, batches: list[dict[str, np.ndarray]]):
        self.batches = batches


class Stateful:
    """Endless batches with a JSON position (exact resume)."""

    def __init__(self, loader: Loader, state: Mapping[str, Any] | None):
        self.loader, self.i = loader, 0
        if state:
            self.set_state(state)

    def __iter__(self) -> Stateful:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = self.loader.batches[self.i % len(self.loader.batches)]
        self.i += 1
        return batch

    def get_state(self) -> dict[str, Any]:
        return {"i": self.i}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.i = int(state["i"])


class Stateless:
    """Endless batches without a position (a resume restarts them)."""

    def __init__(self, loader: Loader):
        self._inner = Stateful(loader, None)

    def __iter__(self) -> Stateless:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        return next(self._inner)


class _Backend(_NumpyBackend):
    stateful = True

    def native_batches(self, data: Any, data_state: Mapping[str, Any] | None) -> Iterator[Any]:
        return Stateful(data, data_state) if self.stateful else Stateless(data)

    def native_eval_batches(self, data: Any) -> Iterator[Any]:
        return iter(data.batches)


class NativeNumpy(NumpyAdapter):
    capabilities: ClassVar[Capabilities] = Capabilities(native_data=True, online=True)

    def __init__(self, stateful: bool = True):
        super().__init__()
        self.stateful = stateful

    def accepts_data(self, data: Any) -> bool:
        return isinstance(data, Loader)

    def step_backend(self, plan: Plan) -> _Backend:
        backend = _Backend(plan, self.gradient_noise)
        backend.stateful = self.stateful
        return backend


def _loader(part: int, size: int = 16) -> Loader:
    ds = regression_task(n_train=128, in_size=2)[part]
    x, y = ds.arrays["x"], ds.arrays["y"]
    return Loader([{"x": x[i : i + size], "y": y[i : i + size]} for i in range(0, len(x), size)])


def loop(adapter: Any = None, **overrides: Any) -> TrainingLoop:
    kwargs: dict[str, Any] = {
        "model": NumpyLinearOp("pipekit_train.core.testing:linear", in_size=2, out_size=1),
        "data": _loader(0),
        "validation": _loader(1),
        "optimizer_config": {"name": "adam", "lr": 0.05},
        "batch_size": 16,
        "max_steps": 20,
        "adapter": adapter or NativeNumpy(),
        "progress": False,
    }
    kwargs.update(overrides)
    return TrainingLoop(**kwargs)


def test_native_batches_train_and_validate() -> None:
    art = loop(validate_every_n_steps=10).run()
    assert art.history["loss"][-1] < art.history["loss"][0]
    assert len(art.history.series("val_loss")[0]) == 2


def test_stateful_loader_resumes_exactly(tmp_path: Path) -> None:
    policy = Checkpoint(tmp_path, every_n_steps=6, async_save=False)
    loop(max_steps=12, checkpoint=policy, validation=None).run()
    assert step_dirs(tmp_path) == [6, 12]
    meta = json.loads((tmp_path / "12" / "meta.json").read_text())
    assert meta["data_iter"] == {"i": 12}  # the loader's own position
    resumed = loop(max_steps=20, checkpoint=policy, validation=None).run()
    reference = loop(max_steps=20, validation=None).run()
    assert resumed.resumed_from_step == 12
    assert resumed.model.serialize_weights() == reference.model.serialize_weights()


def test_stateless_loader_warns_on_resume(tmp_path: Path) -> None:
    policy = Checkpoint(tmp_path, every_n_steps=5, async_save=False)
    loop(NativeNumpy(stateful=False), max_steps=5, checkpoint=policy, validation=None).run()
    with pytest.warns(UserWarning, match="restarts from its beginning"):
        art = loop(
            NativeNumpy(stateful=False), max_steps=10, checkpoint=policy, validation=None
        ).run()
    assert art.resumed_from_step == 5


def test_backend_without_native_loaders_refuses() -> None:
    with pytest.raises(ConfigError, match="Received: data=Loader"):
        loop(adapter=NumpyAdapter())
