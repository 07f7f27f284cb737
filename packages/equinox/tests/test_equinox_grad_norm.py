"""`log_grad_norm=True` on Equinox: every step's value, fused or not, and with gradient
accumulation the norm of the accumulated gradient (the one the update applies)."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipekit_train.core import TrainingLoop
from pipekit_train.core.adapter import GRAD_NORM
from pipekit_train.core.data import ArrayDataset
from pipekit_train.equinox import Equinox, EquinoxModelOp


def _data() -> ArrayDataset:
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (128, 4)).astype(np.float32)
    return ArrayDataset(x=x, y=np.sin(2 * x).sum(1, keepdims=True).astype(np.float32))


def _op() -> EquinoxModelOp:
    return EquinoxModelOp("pipekit_train.equinox.testing:mlp", in_size=4, out_size=1, seed=0)


def _norms(**kw: Any) -> list[float]:
    kwargs: dict[str, Any] = {
        "model": _op(),
        "data": _data(),
        "optimizer_config": {"name": "adam", "lr": 1e-2, "clip_norm": 0.05},
        "batch_size": 16,
        "max_steps": 8,
        "shuffle": False,
        "log_every_n_steps": 3,
        "log_grad_norm": True,
        "progress": False,
    }
    kwargs.update(kw)
    return [float(v) for v in TrainingLoop(**kwargs).run().history[GRAD_NORM]]


def test_fused_steps_report_every_steps_value() -> None:
    one = _norms()
    assert len(one) == 8 and len(set(one)) == 8
    assert min(one) > 0.05  # before clipping: every norm is above the clip
    assert _norms(adapter=Equinox(steps_per_execution=3)) == pytest.approx(one, rel=1e-6)


def test_accumulation_reports_the_norm_of_the_accumulated_gradient() -> None:
    # 2 accumulated batches of 8 apply the mean gradient of 16 samples: the first update's
    # norm is that of the gradient of the first 16 samples at the initial weights
    acc = _norms(batch_size=8, accumulate_grad_batches=2, max_steps=4)
    fused = _norms(
        batch_size=8, accumulate_grad_batches=2, max_steps=4, adapter=Equinox(steps_per_execution=2)
    )
    assert fused == pytest.approx(acc, rel=1e-6)
    model = _op().model
    data = _data()
    batch = [data[i] for i in range(16)]
    x = jnp.stack([b["x"] for b in batch])
    y = jnp.stack([b["y"] for b in batch])

    def loss(m: Any) -> Any:
        return jnp.mean((jax.vmap(m)(x) - y) ** 2)

    grads = eqx.filter_grad(loss)(model)
    leaves = [g for g in jax.tree.leaves(grads) if g is not None]
    expected = float(jnp.sqrt(sum(jnp.sum(g * g) for g in leaves)))
    assert acc[0] == pytest.approx(expected, rel=1e-5)
