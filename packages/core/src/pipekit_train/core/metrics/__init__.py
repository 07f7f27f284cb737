"""Metrics: `fn(pred, target) -> scalar`, array-API functions like the losses.

>>> from pipekit_train.core import metrics
>>> metrics.names()
['accuracy', 'binary_accuracy', 'mae', 'r2', 'rmse']

Name them in `TrainingLoop(metrics=["rmse", "r2"])`; they are computed on validation
data and reported as `val_rmse`, `val_r2`.
"""

from ._metrics import (
    accuracy,
    binary_accuracy,
    describe,
    get,
    mae,
    names,
    r2,
    register,
    resolve_metrics,
    rmse,
)

__all__ = [
    "resolve_metrics",
    "accuracy",
    "binary_accuracy",
    "describe",
    "get",
    "mae",
    "names",
    "r2",
    "register",
    "rmse",
]
