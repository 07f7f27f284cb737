"""Rollout training on `Lightning()` and `Torch()`: the k-step prediction is
`NeuralForward`'s, the loss and the updates are a hand-written plain-torch reference's,
k = 1 is one-step training, and a run resumed mid-schedule ends with the same bytes. The
shared checks live in `core.testing`; the conformance suite kills and resumes a rollout
run (`test_rollout_exact_resume_after_sigkill`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pipekit_train.core import Rollout, TrainingLoop, losses
from pipekit_train.core.testing import (
    check_one_step_rollout,
    check_rollout_monitor_under_rollout,
    check_rollout_prediction,
    check_rollout_resume,
    check_rollout_schedule_counts_skipped_updates,
    golden_rollout_task,
)
from pipekit_train.lightning import Lightning, Torch, TorchModelOp
from pipekit_train.lightning._rollout import RolloutLoss

ADAPTERS = {"lightning": Lightning, "torch": Torch}


def _op() -> TorchModelOp:
    return TorchModelOp(
        "pipekit_train.lightning.testing:mlp", in_size=2, out_size=2, width=16, seed=0
    )


def _predict(model: Any, batch: dict, normalizer: Any, residual: bool, k: int) -> np.ndarray:
    loss = RolloutLoss(Rollout(steps=k, residual=residual), normalizer, losses.get("mse"))
    tensors = {key: torch.from_numpy(np.asarray(v)) for key, v in batch.items()}
    with torch.no_grad():
        _, pred = loss.predict(model.model, tensors, k)
    return pred.numpy()


def test_the_prediction_inside_training_is_neural_forward_k_times() -> None:
    check_rollout_prediction(_op, _predict)


@pytest.mark.parametrize("name", ["lightning", "torch"])
def test_one_step_rollout_is_one_step_training(name: str) -> None:
    check_one_step_rollout(_op, ADAPTERS[name]())


@pytest.mark.parametrize("name", ["lightning", "torch"])
def test_a_skipped_update_counts_on_the_schedule(name: str) -> None:
    check_rollout_schedule_counts_skipped_updates(_op, ADAPTERS[name]())


@pytest.mark.parametrize("name", ["lightning", "torch"])
def test_a_rollout_monitor_sees_one_step_per_application(name: str) -> None:
    check_rollout_monitor_under_rollout(_op, ADAPTERS[name]())


@pytest.mark.parametrize(
    ("name", "backprop", "reduction"),
    [
        ("lightning", "full", "mean"),
        ("lightning", "last", "mean"),
        ("torch", "full", "mean"),
        ("torch", "last", "mean"),
        ("torch", "full", "sum"),  # trainax's summed steps
    ],
)
def test_loss_and_updates_match_a_hand_written_torch_loop(
    name: str, backprop: str, reduction: str
) -> None:
    weights = (1.0, 0.5, 0.25, 2.0)
    train, _ = golden_rollout_task()
    n, steps = 16, 3
    art = TrainingLoop(
        _op(),
        train,
        rollout=Rollout(
            steps=4, weights=weights, backprop=backprop, residual=True, reduction=reduction
        ),
        loss="mse",
        optimizer_config={"name": "adam", "lr": 0.01},
        batch_size=n,
        max_steps=steps,
        shuffle=False,
        seed=3,
        adapter=ADAPTERS[name](),
        progress=False,
    ).run()

    # the reference: plain torch, the same batches in order, no normalizer
    net = _op().model
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    ref_losses = []
    for step in range(steps):
        b = train.get_batch((np.arange(n) + step * n) % len(train))
        x, y = torch.from_numpy(b["x"]), torch.from_numpy(b["y"])
        state, truth, total = x, x, torch.zeros(())
        for i in range(4):
            truth = truth + y[:, i]
            nxt = state + net(state)
            if backprop == "last" and i < 3:
                nxt = nxt.detach()
            total = total + weights[i] * torch.mean((nxt - truth) ** 2)
            state = nxt
        loss = total if reduction == "sum" else total / sum(weights)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ref_losses.append(float(loss.detach()))
    np.testing.assert_allclose(art.history["loss"], ref_losses, rtol=1e-5)
    for got, want in zip(art.model.model.parameters(), net.parameters(), strict=True):
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), atol=1e-6)


@pytest.mark.parametrize("name", ["lightning", "torch"])
def test_resume_mid_schedule_with_noise_is_exact(name: str, tmp_path: Path) -> None:
    check_rollout_resume(_op, ADAPTERS[name](), tmp_path)


def test_fused_and_accumulated_steps_keep_their_meaning() -> None:
    """`Torch(steps_per_execution=3)` runs the same updates; accumulation averages the
    rollout losses of its batches (the length follows the update, not the batch)."""
    train, _ = golden_rollout_task()
    spec = Rollout(steps=4, residual=True, noise_std=0.05, schedule={0: 1, 2: 4})

    def run(adapter: Any, **kw: Any) -> Any:
        return TrainingLoop(
            _op(),
            train,
            rollout=spec,
            normalizer=train.normalizer(),
            loss="mse",
            optimizer_config={"name": "adam", "lr": 0.01},
            batch_size=16,
            max_steps=6,
            seed=3,
            adapter=adapter,
            progress=False,
            **kw,
        ).run()

    one, fused = run(Torch()), run(Torch(steps_per_execution=3))
    assert one.history["loss"] == fused.history["loss"]
    assert one.model.serialize_weights() == fused.model.serialize_weights()
    acc_torch = run(Torch(), accumulate_grad_batches=2)
    acc_lightning = run(Lightning(), accumulate_grad_batches=2)
    np.testing.assert_allclose(acc_torch.history["loss"], acc_lightning.history["loss"], rtol=1e-5)


def test_refusals_name_the_fix(tmp_path: Path) -> None:
    import lightning as L

    from pipekit_train.core import NotSupportedError

    class Own(L.LightningModule):  # its training_step is the user's, not a rollout
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(2, 2)

        def forward(self, x: Any) -> Any:
            return self.net(x)

    train, _ = golden_rollout_task()
    with pytest.raises(NotSupportedError, match=r"your own LightningModule.*Pass the network"):
        TrainingLoop(
            Own(),
            train,
            rollout=Rollout(steps=2, residual=True),
            max_steps=2,
            checkpoint=str(tmp_path / "ck"),
            adapter=Lightning(),
        )
    assert not (tmp_path / "ck").exists()
    with pytest.raises(NotSupportedError, match=r"Rollout training with `compile`.*compile=False"):
        TrainingLoop(
            _op(),
            train,
            rollout=Rollout(steps=2, residual=True),
            max_steps=2,
            adapter=Torch(compile=True),
        )


@pytest.mark.parametrize("name", ["lightning", "torch"])
def test_gradient_checkpointing_recomputes_the_steps_with_the_same_updates(name: str) -> None:
    """`Rollout(gradient_checkpointing=True)`: each step's model application runs again in
    the backward pass (twice the forward calls of an update), with the same losses and
    weights to float tolerance."""
    train, _ = golden_rollout_task()

    def run(flag: bool) -> tuple[Any, int]:
        op = _op()
        calls = [0]

        def count(*_: Any) -> None:
            calls[0] += 1

        spec = Rollout(steps=4, residual=True, backprop=2, gradient_checkpointing=flag)
        loop = TrainingLoop(
            op,
            train,
            rollout=spec,
            normalizer=train.normalizer(),
            loss="mse",
            optimizer_config={"name": "adam", "lr": 0.01},
            batch_size=16,
            max_steps=3,
            seed=3,
            adapter=ADAPTERS[name](),
            progress=False,
        )

        # the adapters train a copy of the network: count the calls of any copy's first
        # layer (a recomputation stops early, before the network's last layer)
        def first_layer(module: Any, *_: Any) -> None:
            if isinstance(module, torch.nn.Linear) and module.in_features == 2:
                count()

        hook = torch.nn.modules.module.register_module_forward_hook(first_layer)
        try:
            art = loop.run()
        finally:
            hook.remove()
        return art, calls[0]

    (plain, n_plain), (ckpt, n_ckpt) = run(False), run(True)
    assert n_plain == 3 * 4 and n_ckpt == 2 * 3 * 4, (n_plain, n_ckpt)
    np.testing.assert_allclose(ckpt.history["loss"], plain.history["loss"], rtol=1e-6)
    for a, b in zip(ckpt.model.model.parameters(), plain.model.model.parameters(), strict=True):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["lightning", "torch"])
def test_the_noise_reaches_training_batches_only(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Core's feed attaches `batch["noise"]` to training batches; validation never sees it."""
    seen: dict[str, list[bool]] = {"train": [], "eval": []}
    train_loss, eval_loss = RolloutLoss.train_loss, RolloutLoss.eval_loss

    def spy_train(self: Any, model_fn: Any, batch: Any, update: int) -> Any:
        seen["train"].append("noise" in batch)
        return train_loss(self, model_fn, batch, update)

    def spy_eval(self: Any, model_fn: Any, batch: Any) -> Any:
        seen["eval"].append("noise" in batch)
        return eval_loss(self, model_fn, batch)

    monkeypatch.setattr(RolloutLoss, "train_loss", spy_train)
    monkeypatch.setattr(RolloutLoss, "eval_loss", spy_eval)
    train, val = golden_rollout_task()
    TrainingLoop(
        _op(),
        train,
        validation=val,
        rollout=Rollout(steps=4, residual=True, noise_std=0.1),
        normalizer=train.normalizer(),
        loss="mse",
        batch_size=16,
        max_steps=2,
        validate_every_n_steps=2,
        adapter=ADAPTERS[name](),
        progress=False,
    ).run()
    assert seen["train"] == [True, True] and seen["eval"] and not any(seen["eval"])
