"""The default `on_nonfinite="stop"` on every backend (fused steps and accumulation too).

A NaN in the batch of step 11 makes that step's loss NaN: the run stops with
`NonFiniteLossError` naming step 11, and the newest checkpoint on disk is from before it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipekit_train.core import Checkpoint, NonFiniteLossError, TrainingLoop
from pipekit_train.core.checkpoint import step_dirs
from pipekit_train.core.data import ArrayDataset

BATCH = 8


def _data(accumulate: int) -> ArrayDataset:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((640, 4)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True).astype(np.float32)
    x[10 * BATCH * accumulate] = np.nan  # the first batch of step 11
    return ArrayDataset(x=x, y=y)


def _setup(backend: str) -> tuple[Any, Any]:
    if backend == "equinox":
        from pipekit_train.equinox import Equinox, EquinoxModelOp

        op = EquinoxModelOp("pipekit_train.equinox.testing:linear", in_size=4, out_size=1)
        return op, Equinox(steps_per_execution=3)
    if backend == "lightning":
        from pipekit_train.lightning import Lightning, LightningModelOp

        op = LightningModelOp("pipekit_train.lightning.testing:linear", in_size=4, out_size=1)
        return op, Lightning(accelerator="cpu")
    from pipekit_train.keras import Keras, KerasModelOp

    op = KerasModelOp("pipekit_train.keras.testing:linear", in_size=4, out_size=1)
    return op, Keras(steps_per_execution=3)


@pytest.mark.parametrize("accumulate", [1, 2])
@pytest.mark.parametrize("backend", ["equinox", "lightning", "keras"])
def test_nan_stops_before_it_is_checkpointed(tmp_path: Path, backend: str, accumulate: int) -> None:
    model, adapter = _setup(backend)
    policy = Checkpoint(tmp_path / "ck", every_n_steps=4, max_to_keep=2, async_save=False)
    loop = TrainingLoop(
        model=model,
        data=_data(accumulate),
        optimizer_config={"name": "sgd", "lr": 0.01},
        batch_size=BATCH,
        accumulate_grad_batches=accumulate,
        max_steps=30,
        shuffle=False,
        checkpoint=policy,
        adapter=adapter,
        progress=False,
    )
    with pytest.raises(NonFiniteLossError, match="step 11"):
        loop.run()
    assert step_dirs(tmp_path / "ck") == [4, 8]


# -- on_nonfinite="skip" -----------------------------------------------------------------

ADAM = {"name": "adam", "lr": 0.01}
SKIP_VARIANTS = [
    ("equinox", 1, 1),
    ("equinox", 3, 1),
    ("equinox", 3, 2),
    ("lightning", 1, 1),
    ("lightning", 1, 2),
    ("keras", 3, 1),  # unfused Keras (jax and torch): packages/keras/tests
    ("keras", 3, 2),
]


def _skip_data(accumulate: int, nan_steps: tuple[int, ...], drop_step: int | None = None) -> Any:
    """Rows in order; a NaN in the first batch of each step in `nan_steps` (1-based).

    `drop_step`: leave out that step's batches (the data a dropped update amounts to).
    """
    rng = np.random.default_rng(0)
    x = rng.standard_normal((640, 4)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True).astype(np.float32)
    per_step = BATCH * accumulate
    for step in nan_steps:
        x[(step - 1) * per_step] = np.nan  # the update's first batch: later ones are finite
    if drop_step is not None:
        keep = np.r_[: (drop_step - 1) * per_step, drop_step * per_step : len(x)]
        x, y = x[keep], y[keep]
    return ArrayDataset(x=x, y=y)


def _skip_setup(backend: str, fused: int) -> tuple[Any, Any]:
    model, adapter = _setup(backend)
    if backend == "equinox":
        from pipekit_train.equinox import Equinox

        adapter = Equinox(steps_per_execution=fused)
    elif backend == "keras":
        from pipekit_train.keras import Keras

        adapter = Keras(steps_per_execution=fused)
    return model, adapter


def _skip_loop(backend: str, fused: int, accumulate: int, data: Any, **kwargs: Any) -> Any:
    model, adapter = _skip_setup(backend, fused)
    return TrainingLoop(
        model=model,
        data=data,
        optimizer_config=ADAM,
        batch_size=BATCH,
        accumulate_grad_batches=accumulate,
        shuffle=False,
        on_nonfinite="skip",
        adapter=adapter,
        progress=False,
        **kwargs,
    )


@pytest.mark.parametrize(("backend", "fused", "accumulate"), SKIP_VARIANTS)
def test_skip_drops_exactly_that_update(backend: str, fused: int, accumulate: int) -> None:
    """The run ends with the weights of a run that never saw the bad update's batches."""
    skipped = _skip_loop(backend, fused, accumulate, _skip_data(accumulate, (5,)), max_steps=9)
    skipped = skipped.run()
    assert skipped.steps == 9
    assert skipped.history.series("nonfinite_skipped") == ([5], [1.0])
    losses = np.asarray(skipped.history["loss"])
    assert np.isnan(losses[4]) and np.isfinite(np.delete(losses, 4)).all()
    # Adam's moments and count untouched: the same weights as 8 updates on the data without
    # that update's batches (an applied update would have made every weight NaN)
    reference = _skip_loop(
        backend, fused, accumulate, _skip_data(accumulate, (), drop_step=5), max_steps=8
    ).run()
    np.testing.assert_array_equal(np.delete(losses, 4), reference.history["loss"])
    assert skipped.model.serialize_weights() == reference.model.serialize_weights()


@pytest.mark.parametrize(("backend", "fused"), [("equinox", 3), ("lightning", 1), ("keras", 3)])
def test_skip_stops_after_max_consecutive_skips(tmp_path: Path, backend: str, fused: int) -> None:
    policy = Checkpoint(tmp_path / "ck", every_n_steps=4, max_to_keep=2, async_save=False)
    loop = _skip_loop(
        backend,
        fused,
        1,
        _skip_data(1, (6, 7, 8)),
        max_steps=20,
        max_consecutive_skips=3,
        checkpoint=policy,
    )
    with pytest.raises(NonFiniteLossError, match="step 8") as info:
        loop.run()
    assert info.value.consecutive == 3
    assert step_dirs(tmp_path / "ck") == [4]  # 8 fell on a skipped step: postponed, never written


def _batchnorm_model(backend: str) -> Any:
    if backend == "equinox":
        from pipekit_train.equinox import EquinoxModelOp

        return EquinoxModelOp(
            "pipekit_train.equinox.testing:batchnorm_mlp", in_size=4, out_size=1, width=8
        )
    if backend == "lightning":
        import torch

        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(), torch.nn.Linear(8, 1)
        )
    from pipekit_train.keras import KerasModelOp

    return KerasModelOp(
        "pipekit_train.keras.testing:mlp", in_size=4, out_size=1, width=8, batch_norm=True
    )


@pytest.mark.parametrize("backend", ["equinox", "lightning", "keras"])
def test_skip_keeps_batchnorm_statistics_finite(backend: str) -> None:
    """A skipped batch does not reach the layer state: inference stays finite."""
    _, adapter = _skip_setup(backend, 1)
    data = _skip_data(1, (3,))
    art = TrainingLoop(
        model=_batchnorm_model(backend),
        data=data,
        validation=_skip_data(1, ()),
        optimizer_config=ADAM,
        batch_size=BATCH,
        max_steps=6,
        shuffle=False,
        on_nonfinite="skip",
        adapter=adapter,
        progress=False,
    ).run()
    assert art.history.series("nonfinite_skipped") == ([3], [1.0])
    assert np.isfinite(art.history["val_loss"]).all()  # eval mode reads the running statistics
