"""Training features beyond the conformance suite: fused steps, RNG resume, accumulation,
mixed precision, Keras-native losses, schedules, the online trainer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest

from pipekit_train.core import Checkpoint, ConfigError, OnlineTrainer, TrainingLoop
from pipekit_train.core.callbacks import LambdaCallback
from pipekit_train.core.checkpoint import step_dirs
from pipekit_train.core.testing import HookRecorder, regression_task
from pipekit_train.core.writers import MemoryWriter
from pipekit_train.keras import Keras, KerasModelOp

LINEAR = "pipekit_train.keras.testing:linear"
MLP = "pipekit_train.keras.testing:mlp"
BACKEND = keras.backend.backend()
jax_only = pytest.mark.skipif(BACKEND != "jax", reason="needs the jax Keras backend")


def loop(
    model: Any = None, *, k: int = 1, precision: str | None = None, **overrides: Any
) -> TrainingLoop:
    train, val = regression_task()
    kwargs: dict[str, Any] = {
        "model": model or KerasModelOp(LINEAR, in_size=4, out_size=1),
        "data": train,
        "validation": val,
        "loss": "mse",
        "optimizer_config": {"name": "adam", "lr": 0.05},
        "batch_size": 16,
        "max_steps": 12,
        "seed": 0,
        "adapter": Keras(steps_per_execution=k, precision=precision),
        "progress": False,
    }
    kwargs.update(overrides)
    return TrainingLoop(**kwargs)


def dropout_mlp() -> KerasModelOp:
    return KerasModelOp(MLP, in_size=4, out_size=1, width=16, depth=1, dropout=0.5, seed=0)


# -- steps_per_execution -----------------------------------------------------------------


@jax_only
def test_fused_steps_match_single_steps(tmp_path: Path) -> None:
    runs = {}
    for k in (1, 3):
        rec, mem = HookRecorder(), MemoryWriter()
        art = loop(
            k=k,
            max_steps=14,  # not a multiple of 3
            validate_every_n_steps=4,  # neither is the validation interval ...
            checkpoint=Checkpoint(
                tmp_path / f"ck{k}", every_n_steps=4, max_to_keep=None, async_save=False
            ),
            callbacks=[rec],
            writers=[mem],
            log_every_n_steps=5,
        ).run()
        runs[k] = (art, rec.calls, mem.records, step_dirs(tmp_path / f"ck{k}"))
    (a1, calls1, rec1, dirs1), (a3, calls3, rec3, dirs3) = runs[1], runs[3]
    assert a3.model.serialize_weights() == a1.model.serialize_weights()
    np.testing.assert_array_equal(a3.history["loss"], a1.history["loss"])
    assert calls3 == calls1  # every on_step_end, validation and checkpoint at the same steps
    assert dirs3 == dirs1 == [4, 8, 12, 14]
    assert [s for s, m in rec3 if "loss" in m] == list(range(1, 15))
    assert rec3 == rec1


@jax_only
@pytest.mark.slow
def test_fused_steps_resume_exactly(tmp_path: Path) -> None:
    directory = tmp_path / "ck"
    policy = Checkpoint(directory, every_n_steps=4, max_to_keep=None, async_save=False)
    loop(dropout_mlp(), k=3, max_steps=10, checkpoint=policy).run()
    resumed = loop(dropout_mlp(), k=3, max_steps=20, checkpoint=policy).run()
    assert resumed.resumed_from_step == 10
    reference = loop(dropout_mlp(), k=1, max_steps=20).run()
    assert resumed.model.serialize_weights() == reference.model.serialize_weights()
    np.testing.assert_array_equal(resumed.history["loss"], reference.history["loss"])


@pytest.mark.skipif(BACKEND != "torch", reason="torch-backend rule")
def test_torch_refuses_steps_per_execution() -> None:
    with pytest.raises(ConfigError, match="steps_per_execution") as info:
        loop(k=2)
    assert "Received" in str(info.value)


# -- exact resume with RNG, accumulation, precision ----------------------------------------


@pytest.mark.slow
def test_dropout_rng_resumes_exactly(tmp_path: Path) -> None:
    directory = tmp_path / "ck"
    policy = Checkpoint(directory, every_n_steps=4, max_to_keep=None, async_save=False)
    first = loop(dropout_mlp(), max_steps=8, checkpoint=policy).run()
    resumed = loop(dropout_mlp(), max_steps=16, checkpoint=policy).run()
    assert resumed.resumed_from_step == 8
    reference = loop(dropout_mlp(), max_steps=16).run()
    assert resumed.model.serialize_weights() == reference.model.serialize_weights()
    np.testing.assert_array_equal(resumed.history["loss"][:8], first.history["loss"])
    # dropout is active while training: inference is deterministic, training losses are noisy
    x = regression_task()[1].get_batch(np.arange(8))["x"]
    np.testing.assert_array_equal(reference.model(x), reference.model(x))


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 3] if BACKEND == "jax" else [1])
def test_gradient_accumulation(tmp_path: Path, k: int) -> None:
    """Two batches of 16 per update: steps count updates, and equal one batch of 32."""
    art = loop(accumulate_grad_batches=2, max_steps=40, k=k).run()
    losses = np.asarray(art.history["loss"])
    assert len(losses) == 40 and losses[-5:].mean() < 0.25 * losses[:5].mean()
    full = loop(batch_size=32, max_steps=40).run()
    np.testing.assert_allclose(losses, full.history["loss"], rtol=1e-5)
    # checkpoints land on updates and resume exactly
    policy = Checkpoint(tmp_path / "ck", every_n_steps=3, max_to_keep=None, async_save=False)
    loop(accumulate_grad_batches=2, max_steps=9, checkpoint=policy, k=k).run()
    resumed = loop(accumulate_grad_batches=2, max_steps=14, checkpoint=policy, k=k).run()
    assert resumed.resumed_from_step == 9
    reference = loop(accumulate_grad_batches=2, max_steps=14, k=k).run()
    assert resumed.model.serialize_weights() == reference.model.serialize_weights()


@pytest.mark.slow
def test_mixed_bfloat16(tmp_path: Path) -> None:
    art = loop(precision="mixed_bfloat16", max_steps=60).run()
    losses = np.asarray(art.history["loss"])
    assert losses[-5:].mean() < 0.25 * losses[:5].mean()
    assert art.plan["adapter"]["kwargs"]["precision"] == "mixed_bfloat16"
    # the trained operator is a plain float32 model again
    assert {str(v.dtype) for v in art.model.model.weights} == {"float32"}
    assert art.model(np.zeros((2, 4), np.float32)).dtype == np.float32
    policy = Checkpoint(tmp_path / "ck", every_n_steps=4, max_to_keep=None, async_save=False)
    loop(precision="mixed_bfloat16", max_steps=8, checkpoint=policy).run()
    resumed = loop(precision="mixed_bfloat16", max_steps=12, checkpoint=policy).run()
    reference = loop(precision="mixed_bfloat16", max_steps=12).run()
    assert resumed.resumed_from_step == 8
    assert resumed.model.serialize_weights() == reference.model.serialize_weights()


# -- losses, schedules, epochs -------------------------------------------------------------


def test_keras_native_loss_is_used_as_is() -> None:
    core = loop(max_steps=6).run()
    native = loop(max_steps=6, loss=keras.losses.MeanSquaredError()).run()
    np.testing.assert_allclose(native.history["loss"], core.history["loss"], rtol=1e-5)
    np.testing.assert_allclose(native.history["val_loss"], core.history["val_loss"], rtol=1e-5)


def test_learning_rate_schedule_reaches_callbacks() -> None:
    seen: dict[int, float] = {}
    schedule = {"schedule": "linear", "init_value": 0.1, "end_value": 0.0, "transition_steps": 10}
    cb = LambdaCallback(on_step_end=lambda state: seen.__setitem__(state.step, state.learning_rate))
    loop(optimizer_config={"name": "sgd", "lr": schedule}, max_steps=10, callbacks=[cb]).run()
    # after step s the optimizer has made s updates: the next update uses the rate at s
    assert seen[2] == pytest.approx(0.08) and seen[10] == pytest.approx(0.0, abs=1e-8)


def test_max_epochs_and_clip_norm() -> None:
    art = loop(
        max_steps=None, max_epochs=2, optimizer_config={"name": "sgd", "lr": 0.05, "clip_norm": 1.0}
    ).run()
    assert art.steps == 2 * (256 // 16)
    assert np.isfinite(art.history["loss"]).all()


# -- online ---------------------------------------------------------------------------------


def _batches(n: int) -> list[dict[str, np.ndarray]]:
    train, _ = regression_task()
    return [train.get_batch(np.arange(i * 8, i * 8 + 8) % len(train)) for i in range(n)]


def test_online_trainer_with_resume(tmp_path: Path) -> None:
    batches = _batches(25)
    make = lambda ck=None: OnlineTrainer(  # noqa: E731
        KerasModelOp(LINEAR, in_size=4, out_size=1),
        loss="mse",
        optimizer_config={"name": "adam", "lr": 0.05},
        checkpoint=ck,
    )
    reference = make()
    preds = reference.run(batches)
    assert all(p.shape == (8, 1) for p in preds)
    assert reference.step == 25 and np.isfinite(reference.last_metrics["loss"])
    first_err = float(np.mean((preds[0] - batches[0]["y"]) ** 2))
    last_err = float(np.mean((preds[-1] - batches[-1]["y"]) ** 2))
    assert last_err < first_err

    policy = Checkpoint(tmp_path / "online", every_n_steps=5, async_save=False)
    part = make(policy)
    part.run(batches[:20])
    part.close()
    assert step_dirs(tmp_path / "online")[-1] == 20
    resumed = make(policy)
    assert resumed.step == 20
    resumed.run(batches[20:])
    resumed.close()
    assert resumed.model.serialize_weights() == reference.model.serialize_weights()


# -- restore_best ------------------------------------------------------------------------
def test_restore_best_holds_the_best_checkpoint(tmp_path: Path) -> None:
    """`restore_best=True`: the best checkpoint is loaded back into the live variables
    after `fit`, and the artifact's weights are its bytes (core's shared check; on torch
    in the backend matrix's pass)."""
    from pipekit_train.core.testing import check_restore_best

    check_restore_best(lambda: KerasModelOp(LINEAR, in_size=4, out_size=1), Keras(), tmp_path)
