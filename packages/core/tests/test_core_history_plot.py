"""`History.figure` / `History.plot`: loss curves labelled with the loss, units, backend and run."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipekit_train.core import Checkpoint, History, TrainingLoop, losses
from pipekit_train.core.data import Normalizer
from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp, regression_task

pytest.importorskip("matplotlib")


def _loop(tmp_path: Path, max_steps: int, **kw: object) -> TrainingLoop:
    train, val = regression_task(n_train=128, n_val=32, in_size=3, out_size=1)
    base: dict = dict(
        model=NumpyLinearOp("pipekit_train.core.testing:linear", in_size=3, out_size=1),
        data=train,
        validation=val,
        loss="mse",
        optimizer_config={"name": "sgd", "learning_rate": 0.05},
        batch_size=16,
        max_steps=max_steps,
        validate_every_n_steps=20,
        log_every_n_steps=5,
        adapter=NumpyAdapter(),
        progress=False,
    )
    base.update(kw)
    return TrainingLoop(**base)


def _legend(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_normalised_run_names_loss_units_backend_and_run(tmp_path: Path) -> None:
    train, _ = regression_task(n_train=128, n_val=32, in_size=3, out_size=1)
    norm = Normalizer.fit(train, keys=("x", "y"))
    art = _loop(
        tmp_path, 100, normalizer=norm, checkpoint=Checkpoint(tmp_path / "runs" / "heat-eqx")
    ).run()
    ax = art.history.figure().axes[0]
    assert ax.get_ylabel() == "MSE (normalised units)"
    assert ax.get_xlabel() == "optimizer step"
    title = ax.get_title()
    assert "MSE loss" in title and "numpy backend" in title and "runs/heat-eqx" in title
    legend = _legend(ax)
    assert legend[:2] == ["train", "validation"]
    assert legend[2].startswith("best validation")
    # the loss falls by more than a decade from its start: a log axis
    assert ax.get_yscale() == "log"
    png = art.history.plot(tmp_path / "loss.png")
    assert Path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unnormalised_run_shows_the_loss_name_without_units(tmp_path: Path) -> None:
    art = _loop(tmp_path, 40).run()
    ax = art.history.figure().axes[0]
    assert ax.get_ylabel() == "MSE"
    # no checkpoint: the run is named by its model factory
    assert "pipekit_train.core.testing:linear" in ax.get_title()


def test_a_resumed_run_keeps_its_labels(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    _loop(tmp_path, 40, checkpoint=Checkpoint(ckpt, every_n_steps=20)).run()
    art = _loop(tmp_path, 80, checkpoint=Checkpoint(ckpt, every_n_steps=20)).run()
    assert art.resumed_from_step == 40
    assert (art.history.backend, art.history.loss) == ("numpy", "MSE")
    assert art.history.series("loss")[0][0] == 1  # the restored history starts at step 1


def test_negative_values_stay_on_a_linear_axis_and_title_can_be_overridden() -> None:
    history = History(
        [(s, {"loss": 1.0 - 0.5 * s, "val_loss": 0.9 - 0.5 * s}) for s in range(1, 6)]
    )
    history.annotate(loss="Gaussian NLL", backend="keras")
    ax = history.figure(title="my run").axes[0]
    assert ax.get_yscale() == "linear"
    assert ax.get_title() == "my run"
    assert ax.get_ylabel() == "Gaussian NLL"
    # a narrow positive range is not stretched onto a log axis either
    flat = History([(s, {"loss": 1.0 + 0.01 * s}) for s in range(1, 6)])
    assert flat.figure().axes[0].get_yscale() == "linear"


def test_other_metrics_are_labelled_as_values_and_unknown_names_are_refused() -> None:
    history = History([(1, {"loss": 1.0, "val_rmse": 0.5}), (2, {"loss": 0.5, "val_rmse": 0.4})])
    history.annotate(loss="MSE", normalized=True)
    ax = history.figure(["loss", "val_rmse"]).axes[0]
    assert ax.get_ylabel() == "value (normalised units)"
    assert _legend(ax) == ["train", "val_rmse"]
    with pytest.raises(Exception, match=r"names=\['nope'\]"):
        history.figure(["nope"])


@pytest.mark.parametrize(
    ("loss", "label"),
    [
        (losses.mse, "MSE"),
        (losses.huber(delta=0.5), "Huber (delta=0.5)"),
        (losses.gaussian_nll, "Gaussian NLL (full=False)"),
        (losses.mse + 0.1 * losses.mae, "MSE + 0.1·MAE"),
        (
            losses.Loss.per_key({"a": losses.mse, "b": losses.mae}, weights={"b": 0.5}),
            "a: MSE + b: 0.5·MAE",
        ),
    ],
)
def test_loss_labels(loss: losses.Loss, label: str) -> None:
    from pipekit_train.core.artifact._history import loss_label

    assert loss_label(loss.describe()) == label
