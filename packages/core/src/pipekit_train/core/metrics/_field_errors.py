"""Normalised field errors, The Well's definitions: `nrmse` and `vrmse`, per sample and field.

Fields are channels-last, `(..., *grid, C)`: the `spatial_ndim` axes before the last
are the grid, the last axis the channels (fields). For each leading index and each
channel the squared error is averaged over the grid:

    nRMSE = sqrt(mean((pred - target)**2) / (mean(target**2) + eps))
    VRMSE = sqrt(mean((pred - target)**2) / (var(target) + eps))

(`var` is the population variance over the grid.) nRMSE divides the RMSE by the
target's root mean square, VRMSE by its standard deviation, so predicting zero scores
an nRMSE of 1 and predicting the target's spatial mean a VRMSE of 1. `eps = 1e-7`
as in The Well. Written against the Python array API (numpy, jax and torch arrays).
"""

from __future__ import annotations

from typing import Any

from pipekit_train.core._checks import is_int
from pipekit_train.core._errors import ConfigError
from pipekit_train.core.losses._losses import _regression_inputs, _shape

__all__ = ["nrmse", "vrmse"]

DEFAULT_EPS = 1e-7


def _reduced_axes(name: str, pred: Any, spatial_ndim: Any, per_channel: Any) -> tuple[int, ...]:
    """The axes averaged over: the grid (and the channels unless `per_channel`)."""
    if not is_int(spatial_ndim) or spatial_ndim < 0:
        raise ConfigError(
            f"`spatial_ndim` must be an int >= 0 (the grid axes before the channel axis). "
            f"Received: spatial_ndim={spatial_ndim!r}. Use 0 for vectors, 2 for (H, W, C) fields."
        )
    if not isinstance(per_channel, bool):
        raise ConfigError(f"`per_channel` must be a bool. Received: per_channel={per_channel!r}.")
    grid = int(spatial_ndim)
    if pred.ndim < grid + 1:
        raise ConfigError(
            f"`pred` must have {grid} grid axes and a channel axis for `{name}`. "
            f"Received: pred.shape={_shape(pred)}, spatial_ndim={grid}."
        )
    if grid == 0 and per_channel:
        raise ConfigError(
            f"`{name}` averages over the grid, and spatial_ndim=0 with per_channel=True leaves "
            "no axis to average over. Received: spatial_ndim=0, per_channel=True. Pass "
            "per_channel=False to pool the variables of a vector state (e.g. Lorenz-96)."
        )
    first = pred.ndim - 1 - grid
    return tuple(range(first, pred.ndim - 1 if per_channel else pred.ndim))


def _ratio(
    name: str,
    pred: Any,
    target: Any,
    spatial_ndim: int,
    per_channel: bool,
    eps: float,
    centred: bool,
) -> Any:
    xp, pred, target = _regression_inputs(name, pred, target)
    axes = _reduced_axes(name, pred, spatial_ndim, per_channel)
    diff = pred - target
    mse = xp.mean(diff * diff, axis=axes)
    if centred:
        target = target - xp.mean(target, axis=axes, keepdims=True)
    scale = xp.mean(target * target, axis=axes)
    return xp.sqrt(mse / (scale + eps))


def nrmse(
    pred: Any,
    target: Any,
    *,
    spatial_ndim: int = 0,
    per_channel: bool = True,
    eps: float = DEFAULT_EPS,
) -> Any:
    """Normalised RMSE, RMSE / RMS of the target, over the grid, per leading index and channel.

    Args:
        pred: predictions `(..., *grid, C)`.
        target: targets of the same shape.
        spatial_ndim: the number of grid axes before the channel axis (0 for vectors).
        per_channel: one value per channel (default), or pool the channels with the grid
            (`(..., d)` vectors whose variables are alike, e.g. Lorenz-96).
        eps: added to the target's mean square.

    Returns:
        The leading shape plus `(C,)` with `per_channel`, else the leading shape.

    Raises:
        ConfigError: mismatched shapes, or no axis to average over.

    Examples:
        >>> import numpy as np
        >>> from pipekit_train.core.metrics import nrmse
        >>> target = np.random.default_rng(0).normal(size=(4, 10, 32, 2))  # (n, lead, grid, C)
        >>> nrmse(np.zeros_like(target), target, spatial_ndim=1).shape
        (4, 10, 2)
    """
    return _ratio("nrmse", pred, target, spatial_ndim, per_channel, eps, centred=False)


def vrmse(
    pred: Any,
    target: Any,
    *,
    spatial_ndim: int = 0,
    per_channel: bool = True,
    eps: float = DEFAULT_EPS,
) -> Any:
    """Variance-scaled RMSE, RMSE / std of the target over the grid (see `nrmse` for the args).

    A prediction of the target's spatial mean scores 1; a constant target makes it
    `RMSE / sqrt(eps)` (large): prefer `nrmse` for nearly uniform fields.
    """
    return _ratio("vrmse", pred, target, spatial_ndim, per_channel, eps, centred=True)
