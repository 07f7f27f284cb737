"""Shape checks at `TrainingLoop` construction on Equinox (`eqx.filter_eval_shape` probe)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import numpy as np
import pytest

from pipekit_train.core import Checkpoint, ConfigError, TrainingLoop
from pipekit_train.core.testing import regression_task
from pipekit_train.equinox import Equinox, EquinoxModelOp

MLP = "pipekit_train.equinox.testing:mlp"


class BatchedDense(eqx.Module):
    """Takes a whole batch `(n, in)`."""

    weight: jax.Array

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.weight


def batched_dense(in_size: int, out_size: int, *, key: Any) -> BatchedDense:
    return BatchedDense(jax.random.normal(key, (in_size, out_size)))


def _loop(tmp_path: Path, model: Any = None, **kw: Any) -> TrainingLoop:
    train, val = regression_task(n_train=32, n_val=8)
    args: dict[str, Any] = {
        "model": model or EquinoxModelOp(MLP, in_size=4, out_size=1, width=8),
        "data": train,
        "validation": val,
        "loss": "mse",
        "batch_size": 8,
        "max_steps": 2,
        "checkpoint": Checkpoint(tmp_path / "ck"),
        "progress": False,
    }
    args.update(kw)
    return TrainingLoop(**args)


@pytest.mark.parametrize(
    "model",
    [
        lambda: EquinoxModelOp(MLP, in_size=4, out_size=1, width=8),
        lambda: EquinoxModelOp("pipekit_train.equinox.testing:dropout_mlp", in_size=4, out_size=1),
        lambda: EquinoxModelOp(
            "pipekit_train.equinox.testing:batchnorm_mlp", in_size=4, out_size=1
        ),
        lambda: EquinoxModelOp(batched_dense, in_size=4, out_size=1, batched=True),
    ],
    ids=["mlp", "dropout", "batchnorm", "batched"],
)
def test_matching_shapes_pass(tmp_path: Path, model: Any) -> None:
    _loop(tmp_path, model())
    assert not (tmp_path / "ck").exists()


def test_batched_model_mismatch(tmp_path: Path) -> None:
    model = EquinoxModelOp(batched_dense, in_size=3, out_size=1, batched=True)
    with pytest.raises(ConfigError, match=r"data\['x'\] with samples of shape \(4,\).*in_size=3"):
        _loop(tmp_path, model)


def test_gaussian_nll_with_two_outputs_per_target_passes(tmp_path: Path) -> None:
    _loop(tmp_path, EquinoxModelOp(MLP, in_size=4, out_size=2, width=8), loss="gaussian_nll")


def test_probe_is_abstract_and_leaves_the_model_alone() -> None:
    op = EquinoxModelOp("pipekit_train.equinox.testing:batchnorm_mlp", in_size=4, out_size=3)
    before = jax.tree.leaves(eqx.filter((op.model, op.model_state), eqx.is_array))
    assert Equinox().output_shape(op, (8, 4), np.dtype("float64")) == (8, 3)
    after = jax.tree.leaves(eqx.filter((op.model, op.model_state), eqx.is_array))
    assert all(a is b for a, b in zip(before, after, strict=True))
    assert Equinox().expected_input_shape(op) is None  # not an MLP/Linear: the kwargs tell
    assert Equinox().expected_input_shape(EquinoxModelOp(MLP, in_size=4, out_size=1)) == (4,)
