"""Core's `OnlineTrainer` on the plain-torch step backend."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pipekit_train.core import Checkpoint, ConfigError, OnlineTrainer
from pipekit_train.lightning import TorchModelOp


def stream(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    w = np.array([[1.5], [-2.0], [0.5]], np.float32)
    out = []
    for _ in range(n):
        x = rng.standard_normal((8, 3)).astype(np.float32)
        out.append({"x": x, "y": x @ w + 0.3})
    return out


def model() -> TorchModelOp:
    return TorchModelOp(
        "pipekit_train.lightning.testing:mlp", in_size=3, out_size=1, width=16, dropout=0.1, seed=0
    )


OPT = {"name": "adam", "lr": {"schedule": "cosine", "init_value": 0.02, "decay_steps": 40}}


def test_online_learns_and_predicts_before_updating() -> None:
    trainer = OnlineTrainer(model(), optimizer_config=OPT, seed=0)
    batches = stream(40)
    before = trainer.model(batches[0]["x"])
    first = trainer(batches[0])
    np.testing.assert_allclose(first, before, rtol=1e-6)  # prediction made before the step
    errs = [float(np.mean((trainer(b) - b["y"]) ** 2)) for b in batches[1:]]
    assert np.mean(errs[-5:]) < 0.3 * np.mean(errs[:5])
    assert trainer.step == 40 and "loss" in trainer.last_metrics
    assert trainer.model.model.training is False


def test_online_checkpoint_resume_is_exact(tmp_path: Path) -> None:
    batches = stream(30)
    policy = Checkpoint(tmp_path / "ck", every_n_steps=5, async_save=False)
    a = OnlineTrainer(model(), optimizer_config=OPT, seed=0, checkpoint=policy)
    a.run(batches[:12])  # checkpoints at 5 and 10; steps 11-12 are lost
    a.close()
    b = OnlineTrainer(model(), optimizer_config=OPT, seed=0, checkpoint=policy)
    assert b.step == 10
    preds_b = b.run(batches[10:])
    ref = OnlineTrainer(model(), optimizer_config=OPT, seed=0)
    preds_ref = ref.run(batches)
    np.testing.assert_array_equal(np.concatenate(preds_b), np.concatenate(preds_ref[10:]))
    assert b.model.serialize_weights() == ref.model.serialize_weights()


def test_online_leaves_global_rng_alone_and_accepts_modules() -> None:
    torch.manual_seed(3)
    net = torch.nn.Linear(3, 1)
    before = torch.get_rng_state()
    trainer = OnlineTrainer(
        net, adapter=model().default_adapter(), optimizer_config={"name": "sgd", "lr": 0.1}
    )
    trainer.run(stream(3))
    assert torch.equal(torch.get_rng_state(), before)
    with pytest.raises(ConfigError, match="adamw_typo"):
        OnlineTrainer(model(), optimizer_config={"name": "adamw_typo"})
