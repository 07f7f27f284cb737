"""What the callbacks that watch a validation metric share (EarlyStopping, ReduceLROnPlateau)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pipekit_train.core._errors import ConfigError

__all__ = ["improved", "monitored_value"]


def improved(value: float, best: float | None, *, mode: str, min_delta: float) -> bool:
    """Whether `value` beats `best` by more than `min_delta` (a non-finite value never does)."""
    if not math.isfinite(value):
        return False
    if best is None:
        return True
    if mode == "min":
        return value < best - min_delta
    return value > best + min_delta


def monitored_value(metrics: Mapping[str, Any], monitor: str, owner: str) -> float:
    """The monitored metric of a validation, or a `ConfigError` listing the available keys."""
    if monitor not in metrics:
        raise ConfigError(
            "`monitor` names a metric that the validation did not produce. "
            f"Received: monitor={monitor!r}. Available keys: {sorted(metrics)}. "
            f"Pass one of them to {owner}(monitor=...) (validation metrics are "
            "prefixed 'val_'), or add the metric to `metrics=`."
        )
    return float(metrics[monitor])
