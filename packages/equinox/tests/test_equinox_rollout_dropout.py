"""Rollout training with dropout on Equinox: every unrolled step draws its own masks
(one key per model application, not one per update)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipekit_train.core import Rollout, TrainingLoop, TrajectoryWindows
from pipekit_train.equinox import EquinoxModelOp

MASK = '''
import equinox as eqx
import jax.numpy as jnp


class Mask(eqx.Module):
    """Its output is dropout applied to ones: the masks themselves (scaled by 2)."""

    ones: object
    dropout: eqx.nn.Dropout

    def __init__(self, size):
        self.ones = jnp.ones(size)
        self.dropout = eqx.nn.Dropout(0.5)

    def __call__(self, x, *, key=None):
        return self.dropout(self.ones + 0 * x, key=key)


def mask(size, *, key):
    return Mask(size)
'''


def test_each_unrolled_step_draws_its_own_dropout_masks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "maskmodel.py").write_text(MASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    windows = TrajectoryWindows(np.zeros((2, 12, 16), np.float32), k=2)  # targets: zeros

    def first_loss(weights: tuple[float, float]) -> float:
        art = TrainingLoop(
            EquinoxModelOp("maskmodel:mask", size=16),
            windows,
            rollout=Rollout(steps=2, weights=weights),
            optimizer_config={"name": "sgd", "lr": 1e-3},
            batch_size=8,
            max_steps=1,
            progress=False,
        ).run()
        return art.history["loss"][0]  # 4 x the fraction of units the step's masks keep

    step1, step2 = first_loss((1.0, 0.0)), first_loss((0.0, 1.0))
    assert 0.5 < step1 < 3.5 and 0.5 < step2 < 3.5  # masks were drawn
    assert step1 != step2  # one mask per step: the same key twice would give equal losses
