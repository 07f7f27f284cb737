"""Metrics against hand-computed numpy references, and the metric registry."""

from __future__ import annotations

import numpy as np
import pytest

from pipekit_train.core import metrics
from pipekit_train.core._errors import ConfigError

RNG = np.random.default_rng(1)
P = RNG.normal(size=(10, 2)).astype(np.float32)
T = RNG.normal(size=(10, 2)).astype(np.float32)


def my_metric(pred, target):
    return np.max(np.abs(pred - target))


def test_regression_metrics():
    d = P.astype(np.float64) - T
    assert float(metrics.mae(P, T)) == pytest.approx(np.mean(np.abs(d)), rel=1e-6)
    assert float(metrics.rmse(P, T)) == pytest.approx(np.sqrt(np.mean(d**2)), rel=1e-6)
    assert metrics.rmse(P, T).dtype == np.float32


def test_r2_matches_uniform_average():
    t = T.astype(np.float64)
    per_output = 1 - ((t - P) ** 2).sum(0) / ((t - t.mean(0)) ** 2).sum(0)
    assert float(metrics.r2(P, T)) == pytest.approx(per_output.mean(), rel=1e-5)
    y = T[:, 0]
    assert float(metrics.r2(y, y)) == pytest.approx(1.0)
    assert float(metrics.r2(np.zeros(4), np.zeros(4))) == 1.0  # constant, exact
    assert float(metrics.r2(np.ones(4), np.zeros(4))) == 0.0  # constant, wrong
    with pytest.raises(ConfigError, match="batch axis"):
        metrics.r2(np.float32(1.0), np.float32(1.0))


def test_accuracy_forms():
    logits = np.array([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [0.0, 0.0, 5.0], [1.0, 0.0, 0.0]])
    labels = np.array([0, 1, 0, 0])
    assert float(metrics.accuracy(logits, labels)) == pytest.approx(0.75)
    assert float(metrics.accuracy(logits, np.eye(3)[labels])) == pytest.approx(0.75)
    assert float(metrics.binary_accuracy(np.array([2.0, -1.0, 0.5]), np.array([1, 1, 0]))) == (
        pytest.approx(1 / 3)
    )
    assert float(metrics.binary_accuracy(np.array([2.0, -1.0]), np.array([True, False]))) == 1.0
    with pytest.raises(ConfigError, match="integer class indices"):
        metrics.accuracy(logits, labels.astype(np.float32))


def test_registry_and_describe():
    assert metrics.names() == ["accuracy", "binary_accuracy", "mae", "r2", "rmse"]
    assert metrics.get("rmse") is metrics.rmse
    assert metrics.get(my_metric) is my_metric
    with pytest.raises(ConfigError) as info:
        metrics.get("rmsee")
    msg = str(info.value)
    assert "`metrics` names an unknown metric. Received: metrics='rmsee'" in msg
    assert "Did you mean 'rmse'" in msg and "'r2'" in msg
    with pytest.raises(ConfigError, match="Received: metrics=1"):
        metrics.get(1)
    assert metrics.describe("r2") == {"name": "r2"}
    assert metrics.describe(my_metric) == {"import_path": f"{__name__}:my_metric"}
    name = "test_core_metrics_maxerr"
    try:
        assert metrics.register(name, my_metric) is my_metric
        assert metrics.get(name) is my_metric
        with pytest.raises(ConfigError, match="already registered"):
            metrics.register(name, my_metric)
    finally:
        metrics._metrics._REGISTRY._items.pop(name, None)
