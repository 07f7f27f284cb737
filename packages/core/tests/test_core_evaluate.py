"""`evaluate` / `TrainingArtifact.evaluate`: test-set numbers with core's definitions, no backend."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipekit_train.core import (
    ArrayDataset,
    ConfigError,
    IntegrityError,
    LocalModelRegistry,
    Normalizer,
    TrainingLoop,
    evaluate,
)
from pipekit_train.core.cli import main
from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp, regression_task

FACTORY = "pipekit_train.core.testing:linear"


def _loop(**overrides: object) -> TrainingLoop:
    train, val = regression_task(n_train=192, n_val=80, in_size=3)
    kwargs: dict = {
        "model": NumpyLinearOp(FACTORY, in_size=3, out_size=1),
        "data": train,
        "validation": val,
        "metrics": ["mae", "rmse"],
        "optimizer_config": {"name": "sgd", "lr": 0.05},
        "batch_size": 32,
        "max_steps": 30,
        "adapter": NumpyAdapter(),
        "progress": False,
    }
    kwargs.update(overrides)
    return TrainingLoop(**kwargs)


def test_evaluate_on_validation_equals_the_runs_last_validation() -> None:
    loop = _loop()
    artifact = loop.run()
    got = artifact.evaluate(loop.plan.validation)
    assert set(got) == {"loss", "mae", "rmse"}
    for name, value in got.items():
        assert value == pytest.approx(artifact.final_metrics[f"val_{name}"], rel=1e-6)


def test_evaluate_equals_numpy_on_the_operators_own_predictions() -> None:
    artifact = _loop().run()
    _, test = regression_task(n_train=8, n_val=100, in_size=3, seed=7)
    got = artifact.evaluate(test, metrics=["mae"], batch_size=17)  # uneven last batch
    x, y = test.arrays["x"], test.arrays["y"]
    pred = np.asarray(artifact.model(x), dtype=np.float64)
    assert got["loss"] == pytest.approx(np.mean((pred - y) ** 2), rel=1e-5)
    assert got["mae"] == pytest.approx(np.mean(np.abs(pred - y)), rel=1e-5)
    assert set(got) == {"loss", "mae"}


def test_evaluate_applies_the_runs_normalizer_like_validation() -> None:
    train, val = regression_task(n_train=192, n_val=80, in_size=3)
    shifted = {k: v * 10 + 3 for k, v in train.arrays.items()}
    vshift = {k: v * 10 + 3 for k, v in val.arrays.items()}
    train, val = ArrayDataset(**shifted), ArrayDataset(**vshift)
    norm = Normalizer.fit(train, keys=("x", "y"))
    loop = _loop(data=train, validation=val, normalizer=norm)
    artifact = loop.run()
    got = artifact.evaluate(val)
    assert got["loss"] == pytest.approx(artifact.final_metrics["val_loss"], rel=1e-6)
    # the free function with the same loss, metrics, batches and normalizer: the same numbers
    free = evaluate(
        artifact.model, val, loss="mse", metrics=["mae", "rmse"], batch_size=32, normalizer=norm
    )
    assert free == got


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 0}, r"Received: batch_size=0"),
        ({"batch_size": True}, r"Received: batch_size=True"),
        ({"metrics": ["nope"]}, r"unknown metric.*'nope'"),
        ({"loss": "msee"}, r"Did you mean 'mse'"),
    ],
)
def test_bad_arguments_are_refused_before_any_prediction(kwargs: dict, match: str) -> None:
    calls: list[int] = []

    def model(x: np.ndarray) -> np.ndarray:
        calls.append(len(x))
        return x[:, :1]

    _, val = regression_task(n_val=10, in_size=3)
    with pytest.raises(ConfigError, match=match):
        evaluate(model, val, **kwargs)
    assert calls == []


def test_data_without_targets_is_refused_with_the_fix() -> None:
    data = ArrayDataset(theta=np.zeros((4, 2), np.float32), x=np.zeros((4, 3), np.float32))
    with pytest.raises(ConfigError, match=r"must hold 'x' and 'y'.*as_supervised"):
        evaluate(lambda x: x, data)


def test_test_metrics_go_into_the_record_and_its_digest(tmp_path: Path) -> None:
    loop = _loop()
    artifact = loop.run()
    test = artifact.evaluate(loop.plan.validation, metrics=["mae"])
    registry = LocalModelRegistry(tmp_path / "reg")
    record = artifact.register(registry, "m", test_metrics=test)
    assert record.metrics["test_loss"] == pytest.approx(test["loss"])
    assert record.metrics["test_mae"] == pytest.approx(test["mae"])
    assert record.metrics["val_loss"] == artifact.final_metrics["val_loss"]
    # editing a stored test metric breaks the record's digest
    manifest = tmp_path / "reg" / "m" / "1" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["metrics"]["test_mae"] = 0.0
    manifest.write_text(json.dumps(data))
    with pytest.raises(IntegrityError):
        registry.record("m", 1)


def test_register_refuses_test_metrics_that_are_not_a_dict(tmp_path: Path) -> None:
    artifact = _loop(max_steps=2).run()
    with pytest.raises(ConfigError, match=r"Received: test_metrics=0\.5"):
        artifact.register(LocalModelRegistry(tmp_path), "m", test_metrics=0.5)  # type: ignore[arg-type]  # the wrong type is the point


def test_cli_evaluate_a_registered_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "evalmodels.py").write_text(
        "from pipekit_train.core.testing import linear\n"
        "def lin(in_size, out_size, *, key):  # not marked with @model_factory\n"
        "    return linear(in_size, out_size, key=key)\n"
        "from pipekit_train.core.testing import regression_task\n"
        "def val(seed=0):\n"
        "    return regression_task(n_train=192, n_val=80, in_size=3, seed=seed)[1]\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    loop = _loop(model=NumpyLinearOp("evalmodels:lin", in_size=3, out_size=1))
    artifact = loop.run()
    registry = LocalModelRegistry(tmp_path / "reg")
    artifact.register(registry, "m")
    expected = artifact.evaluate(loop.plan.validation)
    args = ["evaluate", str(tmp_path / "reg"), "m:1", "--data", "evalmodels:val", "--json"]
    assert main([*args, "--trust", "evalmodels:lin"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["version"] == 1
    assert out["metrics"] == expected  # the run's loss, metrics, batch size and normalizer
    # the fix for an untrusted factory is a flag, not Python
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--trust" in err and "trusted=" not in err
    assert main([*args[:2], "m:x", *args[3:]]) == 2
    assert "m:latest" in capsys.readouterr().err
    assert main([*args, "--trust", "evalmodels", "--metrics", "mae"]) == 0
    assert set(json.loads(capsys.readouterr().out)["metrics"]) == {"loss", "mae"}
