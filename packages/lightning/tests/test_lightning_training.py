"""Training with the Lightning adapter: resume, RNG, accumulation, precision, schedules."""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pipekit_train.core import Checkpoint, TrainingLoop
from pipekit_train.core.adapter import learning_rate_at
from pipekit_train.core.callbacks import LambdaCallback, LearningRateLogger
from pipekit_train.core.checkpoint import step_dirs
from pipekit_train.core.writers import MemoryWriter
from pipekit_train.lightning import Lightning, TorchModelOp

pytestmark = pytest.mark.usefixtures("lightning_module")

MLP = "pipekit_train.lightning.testing:mlp"


def dropout_model(seed: int = 0) -> TorchModelOp:
    return TorchModelOp(MLP, in_size=4, out_size=1, width=16, dropout=0.2, seed=seed)


def make_loop(regression: Any, **overrides: Any) -> TrainingLoop:
    train, val = regression
    kwargs: dict[str, Any] = {
        "model": dropout_model(),
        "data": train,
        "validation": val,
        "optimizer_config": {
            "name": "adamw",
            "lr": {"schedule": "cosine", "init_value": 0.02, "decay_steps": 30, "alpha": 0.1},
            "weight_decay": 0.01,
            "clip_norm": 1.0,
        },
        "batch_size": 16,
        "max_steps": 30,
        "validate_every_n_steps": 5,
        "seed": 0,
        "adapter": Lightning(accelerator="cpu"),
        "progress": False,
    }
    kwargs.update(overrides)
    return TrainingLoop(**kwargs)


class Boom(RuntimeError):
    pass


def crash_at(step: int) -> LambdaCallback:
    def on_step_end(state: Any) -> None:
        if state.step == step:
            raise Boom(f"crash at {step}")

    return LambdaCallback(on_step_end=on_step_end)


@pytest.mark.parametrize(
    "adapter_kwargs, loop_kwargs",
    [
        ({}, {}),  # dropout + cosine schedule + adamw + clipping: RNG and scheduler state
        (
            {},
            {
                "accumulate_grad_batches": 2,
                "optimizer_config": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
            },
        ),
        ({"precision": "bfloat16-mixed"}, {}),
    ],
    ids=["dropout-schedule", "accumulate-sgd", "bf16"],
)
def test_exact_resume_after_crash(
    regression: Any, tmp_path: Path, adapter_kwargs: dict, loop_kwargs: dict
) -> None:
    extra: dict[str, Any] = {"adapter": Lightning(accelerator="cpu", **adapter_kwargs)}
    extra.update(loop_kwargs)
    policy = Checkpoint(tmp_path / "ck", every_n_steps=4, max_to_keep=2)
    with pytest.raises(Boom):
        make_loop(regression, checkpoint=policy, callbacks=[crash_at(14)], **extra).run()
    assert step_dirs(tmp_path / "ck") == [8, 12]
    resumed = make_loop(regression, checkpoint=policy, **extra).run()
    reference = make_loop(regression, **extra).run()
    assert resumed.resumed_from_step == 12
    assert resumed.model.serialize_weights() == reference.model.serialize_weights()
    np.testing.assert_array_equal(resumed.history["loss"], reference.history["loss"])
    assert resumed.history.series("val_loss") == reference.history.series("val_loss")


def test_rerun_after_finish_resumes_at_the_end(regression: Any, tmp_path: Path) -> None:
    policy = Checkpoint(tmp_path / "ck", every_n_steps=10, async_save=False)
    first = make_loop(regression, max_steps=10, checkpoint=policy).run()
    again = make_loop(regression, max_steps=10, checkpoint=policy).run()
    assert again.resumed_from_step == 10 and again.steps == 10
    assert again.model.serialize_weights() == first.model.serialize_weights()


def test_global_rng_untouched_and_model_op_not_mutated(regression: Any) -> None:
    loop = make_loop(regression, max_steps=6)
    before_weights = loop.plan.model.serialize_weights()
    torch.manual_seed(7)
    np.random.seed(7)
    random.seed(7)
    states = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    art = loop.run()
    assert torch.equal(torch.get_rng_state(), states[0])
    np.testing.assert_array_equal(np.random.get_state()[1], states[1])
    assert random.getstate() == states[2]
    assert loop.plan.model.serialize_weights() == before_weights
    assert art.model.serialize_weights() != before_weights


def test_accumulation_matches_full_batch(regression: Any) -> None:
    """k batches of `batch_size` per update: the same as one batch of k * batch_size."""
    sgd = {"name": "sgd", "lr": 0.05}
    model = TorchModelOp("pipekit_train.lightning.testing:linear", in_size=4, out_size=1)
    full = make_loop(
        regression, model=model, optimizer_config=sgd, max_steps=12, batch_size=64
    ).run()
    split = make_loop(
        regression,
        model=model,
        optimizer_config=sgd,
        max_steps=12,
        batch_size=16,
        accumulate_grad_batches=4,
    ).run()
    assert split.steps == 12 and len(split.history["loss"]) == 12
    np.testing.assert_allclose(split.history["loss"], full.history["loss"], rtol=1e-5)
    x = regression[1].get_batch(np.arange(8))["x"]
    np.testing.assert_allclose(split.model(x), full.model(x), rtol=1e-5, atol=1e-6)


def test_bf16_mixed_trains(regression: Any) -> None:
    art = make_loop(
        regression,
        max_steps=40,
        optimizer_config={"name": "adam", "lr": 0.02},
        adapter=Lightning(accelerator="cpu", precision="bf16-mixed"),
    ).run()
    losses = np.asarray(art.history["loss"])
    assert losses[-5:].mean() < 0.5 * losses[:5].mean()
    assert art.model.model[0].weight.dtype == torch.float32


def test_learning_rate_reported_per_core_schedule(regression: Any) -> None:
    mem = MemoryWriter()
    loop = make_loop(
        regression,
        max_steps=12,
        callbacks=[LearningRateLogger()],
        writers=[mem],
        validation=None,
        validate_every_n_steps=None,
    )
    loop.run()
    spec = loop.plan.optimizer_config["learning_rate"]
    logged = [(s, m["lr"]) for s, m in mem.records if "lr" in m]
    assert [s for s, _ in logged] == list(range(1, 13))
    np.testing.assert_allclose(
        [v for _, v in logged], [learning_rate_at(spec, s) for s, _ in logged], rtol=1e-6
    )


def test_native_optimizer_callable(regression: Any) -> None:
    import functools

    art = make_loop(
        regression,
        max_steps=5,
        validation=None,
        validate_every_n_steps=None,
        optimizer_config=functools.partial(torch.optim.SGD, lr=0.01, momentum=0.9),
    ).run()
    assert art.steps == 5


def test_lightning_callbacks_are_forwarded(regression: Any, lightning_module: Any) -> None:
    seen: list[int] = []

    class Probe(lightning_module.Callback):
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            seen.append(trainer.global_step)

    make_loop(
        regression, max_steps=4, adapter=Lightning(accelerator="cpu", callbacks=[Probe()])
    ).run()
    assert seen == [1, 2, 3, 4]


def test_artifact_metadata(regression: Any) -> None:
    art = make_loop(regression, max_steps=5).run()
    assert art.backend == "lightning"
    assert {"torch", "lightning", "safetensors"} <= set(art.versions)
    assert art.plan["adapter"]["type"] == "pipekit_train.lightning:Lightning"
    assert art.model.model.training is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        art.model(regression[1].get_batch(np.arange(3))["x"])


def test_core_stream_resumes_exactly(regression: Any, tmp_path: Path) -> None:
    from pipekit_train.core.data import IterableDataset

    train, val = regression
    arrays = train.get_batch(np.arange(len(train)))

    def samples() -> Any:
        for i in range(len(train)):
            yield {"x": arrays["x"][i], "y": arrays["y"][i]}

    kwargs: dict[str, Any] = dict(
        data=IterableDataset(samples), max_steps=20, validate_every_n_steps=10
    )
    policy = Checkpoint(tmp_path / "ck", every_n_steps=5, max_to_keep=None)
    with pytest.raises(Boom):
        make_loop(regression, checkpoint=policy, callbacks=[crash_at(13)], **kwargs).run()
    resumed = make_loop(regression, checkpoint=policy, **kwargs).run()
    reference = make_loop(regression, **kwargs).run()
    assert resumed.resumed_from_step == 10 and resumed.steps == 20
    assert resumed.model.serialize_weights() == reference.model.serialize_weights()


def test_trainer_banners_and_the_litlogger_tip_are_dropped(regression: Any) -> None:
    import logging

    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Collect(level=logging.INFO)
    parent = logging.getLogger("lightning.pytorch")
    parent.addHandler(handler)
    try:
        make_loop(regression, max_steps=2, validation=None, validate_every_n_steps=None).run()
    finally:
        parent.removeHandler(handler)
    assert not [m for m in seen if m.startswith(("GPU available", "TPU available"))], seen
    assert not [m for m in seen if "litlogger" in m]
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    assert not rank_zero.filters  # the filter lives only while the adapter runs


def test_restore_best_holds_the_best_checkpoint(tmp_path: Path) -> None:
    """`restore_best=True`: after `Trainer.fit` the best checkpoint is loaded back into
    the network, and the artifact's weights are its bytes (core's shared check)."""
    from pipekit_train.core.testing import check_restore_best

    def model() -> TorchModelOp:
        return TorchModelOp("pipekit_train.lightning.testing:linear", in_size=4, out_size=1)

    check_restore_best(model, Lightning(accelerator="cpu"), tmp_path)
