"""A model with layer state (BatchNorm) under rollout training on Equinox: refused
before any work, naming the model's state, the rollout and the fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipekit_train.core import ConfigError, Rollout, TrainingLoop, TrajectoryWindows
from pipekit_train.equinox import EquinoxModelOp


def test_a_model_with_layer_state_is_refused_before_any_work(tmp_path: Path) -> None:
    states = np.cumsum(np.random.default_rng(0).normal(size=(2, 12, 3)), axis=1)
    windows = TrajectoryWindows(states.astype(np.float32), k=2)
    op = EquinoxModelOp(
        "pipekit_train.equinox.testing:batchnorm_mlp", in_size=3, out_size=3, width=8
    )
    assert op.model_state is not None
    with pytest.raises(
        ConfigError,
        match=r"does not carry layer state \(e\.g\. BatchNorm statistics\).*Received: a model "
        r"with layer state and rollout=Rollout\(steps=2\).*LayerNorm.*or drop `rollout`",
    ):
        TrainingLoop(
            op,
            windows,
            rollout=Rollout(steps=2),
            batch_size=4,
            max_steps=2,
            checkpoint=str(tmp_path / "ck"),
            progress=False,
        )
    assert not (tmp_path / "ck").exists()
