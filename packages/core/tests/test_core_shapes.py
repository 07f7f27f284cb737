"""Shape checks at `TrainingLoop` construction (`Adapter.output_shape`, `check_shapes`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipekit_train.core import Checkpoint, ConfigError, TrainingLoop, losses
from pipekit_train.core.adapter import Adapter
from pipekit_train.core.data import ArrayDataset
from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp, regression_task

FACTORY = "pipekit_train.core.testing:linear"


def _data(n: int, in_size: int, out_size: int) -> ArrayDataset:
    rng = np.random.default_rng(0)
    return ArrayDataset(
        x=rng.standard_normal((n, in_size)).astype(np.float32),
        y=rng.standard_normal((n, out_size)).astype(np.float32),
    )


def _loop(tmp_path: Path, *, in_size: int = 4, out_size: int = 1, **kw: Any) -> TrainingLoop:
    train, val = regression_task(n_train=32, n_val=8)
    args: dict[str, Any] = {
        "model": NumpyLinearOp(FACTORY, in_size=in_size, out_size=out_size),
        "data": train,
        "validation": val,
        "loss": "mse",
        "optimizer_config": {"name": "sgd", "learning_rate": 0.1},
        "batch_size": 8,
        "max_steps": 2,
        "checkpoint": Checkpoint(tmp_path / "ck"),
        "adapter": NumpyAdapter(),
        "progress": False,
    }
    args.update(kw)
    return TrainingLoop(**args)


def test_matching_shapes_pass(tmp_path: Path) -> None:
    loop = _loop(tmp_path)
    assert loop.plan.total_steps == 2
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize("which", ["data", "validation"])
def test_input_width_mismatch_names_dataset_key_and_shapes(tmp_path: Path, which: str) -> None:
    with pytest.raises(ConfigError) as info:
        _loop(tmp_path, **{which: _data(16, 5, 1)})
    msg = str(info.value)
    assert f"Received: {which}['x'] with samples of shape (5,)" in msg
    assert "the model expects inputs of shape (4,)" in msg
    assert f"NumpyLinearOp '{FACTORY}' with in_size=4" in msg
    assert "build the model with in_size=5" in msg
    assert isinstance(info.value.__cause__, ValueError)  # numpy's own error is kept
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize("which", ["data", "validation"])
def test_output_width_mismatch_vs_targets(tmp_path: Path, which: str) -> None:
    with pytest.raises(ConfigError) as info:
        _loop(tmp_path, **{which: _data(16, 4, 2)})
    msg = str(info.value)
    assert f"Received: {which}['y'] with samples of shape (2,)" in msg
    assert "the model predicts samples of shape (1,)" in msg
    assert "'mse'" in msg and "out_size=1" in msg
    assert "build the model with out_size=2" in msg
    assert not (tmp_path / "ck").exists()


def test_missing_trailing_axis_is_named(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    flat = ArrayDataset(x=rng.standard_normal((16, 4)), y=rng.standard_normal(16))
    with pytest.raises(ConfigError, match=r"shape \(\), but the model predicts .* \(1,\)"):
        _loop(tmp_path, data=flat)


# ------------------------------------------------------------------ the rules, via a fake


class _Probe(Adapter):
    """An adapter whose probe answers a fixed shape (or raises)."""

    name = "probe"

    def __init__(self, out: Any = None, error: Exception | None = None):
        self.out, self.error, self.calls = out, error, []

    def run(self, plan: Any) -> Any:  # pragma: no cover - never run here
        raise AssertionError

    def get_config(self) -> dict[str, Any]:
        return {"type": "probe"}

    def output_shape(self, model: Any, input_shape: Any, dtype: Any = np.float32) -> Any:
        self.calls.append((input_shape, np.dtype(dtype)))
        if self.error is not None:
            raise self.error
        return None if self.out is None else (input_shape[0], *self.out)


def _probe_loop(adapter: _Probe, loss: Any = "mse", **kw: Any) -> TrainingLoop:
    args: dict[str, Any] = {
        "model": NumpyLinearOp(FACTORY, in_size=4, out_size=1),
        "data": _data(16, 4, 3),
        "loss": loss,
        "batch_size": 8,
        "max_steps": 1,
        "adapter": adapter,
        "progress": False,
    }
    args.update(kw)
    return TrainingLoop(**args)


def test_probe_gets_batch_shape_and_dtype_once_per_distinct_input() -> None:
    adapter = _Probe(out=(3,))
    _probe_loop(adapter, validation=_data(4, 4, 3))
    assert adapter.calls == [((8, 4), np.dtype("float32"))]  # same shapes: probed once
    adapter = _Probe(out=(3,))
    val = ArrayDataset(x=np.zeros((4, 4)), y=np.zeros((4, 3)))
    _probe_loop(adapter, validation=val)
    assert adapter.calls == [((8, 4), np.dtype("float32")), ((8, 4), np.dtype("float64"))]


def test_no_probe_means_no_check() -> None:
    _probe_loop(_Probe(out=None))


@pytest.mark.parametrize(
    "loss, out",
    [
        ("gaussian_nll", (6,)),  # mean and log-variance: 2x the target's width
        ("cross_entropy", (7,)),  # logits vs one-hot/labels: not checked
        (lambda pred, target: ((pred - target) ** 2).mean(), (1,)),  # user callable
        (losses.Loss.per_key({"a": "mse"}), (1,)),
    ],
)
def test_losses_that_change_shapes_are_not_checked(loss: Any, out: Any) -> None:
    _probe_loop(_Probe(out=out), loss=loss)


@pytest.mark.parametrize(
    "loss", ["mae", "huber", "binary_cross_entropy", losses.mse + 0.1 * losses.mae]
)
def test_same_shape_losses_are_checked(loss: Any) -> None:
    with pytest.raises(ConfigError, match=r"predicts samples of shape \(1,\)"):
        _probe_loop(_Probe(out=(1,)), loss=loss)


def test_a_weighted_loss_with_a_shape_changing_term_is_not_checked() -> None:
    _probe_loop(_Probe(out=(6,)), loss=losses.mse + losses.gaussian_nll)


def test_failed_probe_without_expectation_quotes_the_backend() -> None:
    err = TypeError("dot_general requires contracting dimensions to have the same shape")
    model = NumpyLinearOp(FACTORY, in_size=4, out_size=3)
    model.kwargs = {}  # nothing to tell the expected width from
    with pytest.raises(ConfigError) as info:
        _probe_loop(_Probe(error=err), model=model)
    msg = str(info.value)
    assert "Received: data['x'] with samples of shape (4,) (float32)" in msg
    assert "dot_general requires contracting dimensions" in msg
    assert info.value.__cause__ is err


def test_a_failed_probe_of_a_channels_last_operator_names_the_layout() -> None:
    """A channels-first network behind `layout="channels_last"` reads the data's last
    axis as its channels: the probe's error says so when the factory names no channels."""
    err = TypeError("conv_general_dilated lhs feature dimension 2 must equal 3")
    model = NumpyLinearOp(FACTORY, in_size=4, out_size=3)
    model.kwargs = {}
    model.layout = "channels_last"  # type: ignore[attr-defined]  # as the backends' operators
    fields = ArrayDataset(x=np.zeros((16, 8, 2), np.float32), y=np.zeros((16, 8, 2), np.float32))
    with pytest.raises(ConfigError) as info:
        _probe_loop(_Probe(error=err), model=model, data=fields)
    msg = str(info.value)
    assert "Received: data['x'] with samples of shape (8, 2)" in msg
    assert "layout='channels_last'" in msg and "last axis (size 2)" in msg
    assert info.value.__cause__ is err


def test_streams_are_not_probed() -> None:
    from pipekit_train.core.data import IterableDataset

    def gen() -> Any:
        while True:
            yield {"x": np.zeros(4, np.float32), "y": np.zeros(3, np.float32)}

    adapter = _Probe(out=(99,))
    _probe_loop(adapter, data=IterableDataset(gen))
    assert adapter.calls == []
