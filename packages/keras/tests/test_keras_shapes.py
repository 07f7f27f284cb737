"""Shape checks at `TrainingLoop` construction on Keras (`compute_output_spec` probe).

Run on the jax backend here and on torch by `test_keras_backends.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest

from pipekit_train.core import Checkpoint, TrainingLoop
from pipekit_train.core.testing import regression_task
from pipekit_train.keras import Keras, KerasModelOp

MLP = "pipekit_train.keras.testing:mlp"


class Sub(keras.Model):
    """A subclassed model without an `Input` (built from `in_size`)."""

    def __init__(self, out_size: int) -> None:
        super().__init__()
        self.dense = keras.layers.Dense(out_size)
        self.drop = keras.layers.Dropout(0.5)

    def call(self, x: Any) -> Any:
        return self.drop(self.dense(x))


def subclassed(in_size: int, out_size: int) -> Sub:
    return Sub(out_size)


def functional(in_size: int, out_size: int) -> keras.Model:
    inputs = keras.Input((in_size,))
    return keras.Model(inputs, keras.layers.Dense(out_size)(keras.layers.Dense(8)(inputs)))


def _loop(tmp_path: Path, model: Any = None, **kw: Any) -> TrainingLoop:
    train, val = regression_task(n_train=32, n_val=8)
    args: dict[str, Any] = {
        "model": model or KerasModelOp(MLP, in_size=4, out_size=1, width=8, dropout=0.5),
        "data": train,
        "validation": val,
        "loss": "mse",
        "batch_size": 8,
        "max_steps": 2,
        "checkpoint": Checkpoint(tmp_path / "ck"),
        "adapter": Keras(),
        "progress": False,
    }
    args.update(kw)
    return TrainingLoop(**args)


@pytest.mark.parametrize("factory", [MLP, functional, subclassed], ids=["seq", "fun", "sub"])
def test_matching_shapes_pass(tmp_path: Path, factory: Any) -> None:
    _loop(tmp_path, KerasModelOp(factory, in_size=4, out_size=1))
    assert not (tmp_path / "ck").exists()


def test_unbuilt_layers_are_not_probed() -> None:
    # Sub's Dense takes its width at the first call: any width trains, and probing would
    # build it (adding weights the run's fresh copy of the model does not have).
    op = KerasModelOp(subclassed, in_size=3, out_size=1)
    assert Keras().output_shape(op, (8, 4)) is None
    assert not op.model.dense.built


def test_probe_is_symbolic_and_leaves_the_model_alone() -> None:
    op = KerasModelOp(MLP, in_size=4, out_size=3, dropout=0.5)
    before = [
        keras.ops.convert_to_numpy(v) for v in op.model.variables
    ]  # weights and dropout seed state
    assert Keras().output_shape(op, (8, 4), np.dtype("float64")) == (8, 3)
    after = [keras.ops.convert_to_numpy(v) for v in op.model.variables]
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    assert Keras().expected_input_shape(op) == (4,)
    assert Keras().expected_input_shape(KerasModelOp(subclassed, in_size=4, out_size=1)) is None
