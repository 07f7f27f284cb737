"""`log_grad_norm=True` on Keras: fused executions and accumulation keep every update's
value (the same as one step per execution), and the combinations it cannot record refuse
before any work. The agreement with the other backends is in the golden-run suite."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest

from pipekit_train.core import ConfigError, TrainingLoop
from pipekit_train.core.adapter import GRAD_NORM
from pipekit_train.core.data import ArrayDataset
from pipekit_train.keras import Keras, KerasModelOp


def _loop(**kw: Any) -> TrainingLoop:
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (128, 4)).astype(np.float32)
    y = np.sin(2 * x).sum(1, keepdims=True).astype(np.float32)
    kwargs: dict[str, Any] = {
        "model": KerasModelOp("pipekit_train.keras.testing:mlp", in_size=4, out_size=1, seed=0),
        "data": ArrayDataset(x=x, y=y),
        "batch_size": 16,
        "max_steps": 11,
        "shuffle": False,
        "log_every_n_steps": 3,
        "log_grad_norm": True,
        "progress": False,
        "optimizer_config": {"name": "adam", "lr": 1e-2},
    }
    kwargs.update(kw)
    return TrainingLoop(**kwargs)


def _norms(**kw: Any) -> list[float]:
    return [float(v) for v in _loop(**kw).run().history[GRAD_NORM]]


@pytest.mark.slow
def test_fused_and_accumulated_updates_keep_every_value() -> None:
    one = _norms()
    assert len(one) == 11 and len(set(one)) == 11
    if keras.backend.backend() == "jax":  # fused executions exist on jax only
        assert _norms(adapter=Keras(steps_per_execution=4)) == one
        acc = _norms(accumulate_grad_batches=2)
        assert _norms(accumulate_grad_batches=2, adapter=Keras(steps_per_execution=3)) == acc
        assert len(acc) == 11 and acc != one


def test_skip_and_float16_refuse_it() -> None:
    with pytest.raises(ConfigError, match="on_nonfinite='skip'"):
        _loop(on_nonfinite="skip")
    with pytest.raises(ConfigError, match="precision='float16-mixed'"):
        _loop(adapter=Keras(precision="float16-mixed"))
