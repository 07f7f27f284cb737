"""Metrics: `fn(pred, target) -> scalar`, array-API functions like the losses.

>>> from pipekit_train.core import metrics
>>> metrics.names()
['accuracy', 'binary_accuracy', 'mae', 'r2', 'rmse']

Name them in `TrainingLoop(metrics=["rmse", "r2"])`; they are computed on validation
data and reported as `val_rmse`, `val_r2`.

Rollout metrics (The Well's nRMSE and VRMSE per field, a binned isotropic spectral
error, per lead time and per lead-time window, the valid prediction time) are functions
here too: `nrmse`, `vrmse`, `spectral_error`, `rollout_errors`, `lead_windows`,
`window_means`, `summarize`, `valid_prediction_time`.

Ensemble scores (host numpy): `crps_ensemble` (fair or standard), `crps_gaussian`,
`spread_skill`, `ensemble_ranks`, `rank_histogram`, `rank_flatness`, and all of them per
lead time, `ensemble_lead_metrics`.
"""

from ._ensemble import (
    crps_ensemble,
    crps_gaussian,
    ensemble_lead_metrics,
    ensemble_ranks,
    rank_flatness,
    rank_histogram,
    spread_skill,
)
from ._field_errors import nrmse, vrmse
from ._lead_time import (
    DEFAULT_LEAD_BOUNDS,
    lead_windows,
    rollout_errors,
    summarize,
    valid_prediction_time,
    window_means,
)
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
from ._spectral import spectral_bins, spectral_error, wavenumbers

__all__ = [
    "DEFAULT_LEAD_BOUNDS",
    "crps_ensemble",
    "crps_gaussian",
    "ensemble_lead_metrics",
    "ensemble_ranks",
    "rank_flatness",
    "rank_histogram",
    "spread_skill",
    "lead_windows",
    "nrmse",
    "rollout_errors",
    "spectral_bins",
    "spectral_error",
    "summarize",
    "valid_prediction_time",
    "vrmse",
    "wavenumbers",
    "window_means",
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
