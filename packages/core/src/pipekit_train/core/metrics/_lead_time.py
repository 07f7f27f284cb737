"""Errors of a rollout against lead time: per lead, per lead-time window, and summaries.

A rollout of `H` steps from `n` starts is compared with the truth as arrays
`(n, H, *grid, C)`: lead `h` (1-based) is axis 1 index `h - 1`. `rollout_errors`
computes nRMSE and VRMSE (and, on a grid, the spectral error) per lead and channel,
averaged over the starts; `lead_windows` and `window_means` aggregate over windows
of lead times (e.g. leads 1–10, 11–30, 31–100, as The Well reports); `summarize`
flattens it all into scalars named for monitoring (`"rollout_nrmse_lead_1_10"`);
`valid_prediction_time` reads off how long an error stays under a threshold.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pipekit_train.core._checks import is_int, positive_int
from pipekit_train.core._errors import ConfigError

from ._field_errors import DEFAULT_EPS, nrmse, vrmse
from ._spectral import spectral_error

__all__ = [
    "DEFAULT_LEAD_BOUNDS",
    "lead_windows",
    "rollout_errors",
    "summarize",
    "valid_prediction_time",
    "window_means",
]

DEFAULT_LEAD_BOUNDS = (10, 30, 100)
"""Last leads of the default windows: 1–10, 11–30, 31–100, then 101–H."""

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def lead_windows(
    horizon: int, bounds: Sequence[int] = DEFAULT_LEAD_BOUNDS
) -> list[tuple[int, int]]:
    """Windows of lead times `(first, last)` (1-based, inclusive) covering `1..horizon`.

    `bounds` are the last leads of the windows; those beyond `horizon` are cut, and a
    last window runs to `horizon` when the bounds stop short of it.

    Examples:
        >>> from pipekit_train.core.metrics import lead_windows
        >>> lead_windows(50)
        [(1, 10), (11, 30), (31, 50)]
        >>> lead_windows(12, bounds=(1, 4))
        [(1, 1), (2, 4), (5, 12)]
    """
    horizon = positive_int("horizon", horizon)
    ends = [int(b) for b in bounds]
    if any(not is_int(b) or b < 1 for b in bounds) or ends != sorted(set(ends)):
        raise ConfigError(
            "`bounds` must be increasing positive lead times. "
            f"Received: bounds={list(bounds)!r}. Use e.g. bounds=(1, 10, 30, 100)."
        )
    ends = [b for b in ends if b < horizon] + [horizon]
    starts = [1, *(e + 1 for e in ends[:-1])]
    return list(zip(starts, ends, strict=True))


def window_means(
    per_lead: Any, windows: Sequence[tuple[int, int]]
) -> dict[tuple[int, int], np.ndarray]:
    """The mean over each window of leads of an array whose axis 0 is the lead (`h - 1`)."""
    values = np.asarray(per_lead, dtype=np.float64)
    out = {}
    for first, last in windows:
        if not 1 <= first <= last <= values.shape[0]:
            raise ConfigError(
                f"A lead window must lie in 1..{values.shape[0]}. Received: window "
                f"({first}, {last}). Build windows with lead_windows(horizon)."
            )
        out[(int(first), int(last))] = values[first - 1 : last].mean(axis=0)
    return out


def rollout_errors(
    pred: Any,
    target: Any,
    *,
    spatial_ndim: int = 0,
    per_channel: bool = True,
    spectral: bool | None = None,
    eps: float = DEFAULT_EPS,
) -> dict[str, np.ndarray]:
    """nRMSE, VRMSE (and the spectral error on a grid) per lead and channel.

    Args:
        pred: rollouts `(n, H, *grid, C)`: `n` starts, `H` leads (lead 1 first).
        target: the true states at the same leads, the same shape.
        spatial_ndim: grid axes (0 for vector states).
        per_channel: as for `nrmse` (pass False for vector states, whose variables
            are pooled; the channel axis then has size 1).
        spectral: add the binned spectral error (`spectral_error`, relative, default
            bins); None: when `spatial_ndim` is 1 or 2.
        eps: as for `nrmse`.

    Returns:
        `{"nrmse": (H, C), "vrmse": (H, C)}` averaged over the starts, plus
        `"spectral": (H, n_bins, C)`.
    """
    p, t = np.asarray(pred), np.asarray(target)
    if p.ndim < 3:
        raise ConfigError(
            "`pred` must be rollouts (n_starts, horizon, *state_shape). "
            f"Received: pred.shape={p.shape}. Stack the rollouts, starts first."
        )
    out: dict[str, np.ndarray] = {}
    for name, fn in (("nrmse", nrmse), ("vrmse", vrmse)):
        value = np.asarray(fn(p, t, spatial_ndim=spatial_ndim, per_channel=per_channel, eps=eps))
        if not per_channel:
            value = value[..., None]
        out[name] = value.reshape(p.shape[0], p.shape[1], -1).mean(axis=0)
    if spectral is None:
        spectral = spatial_ndim in (1, 2)
    if spectral:
        out["spectral"] = spectral_error(p, t, spatial_ndim=spatial_ndim).mean(axis=0)
    return out


def summarize(
    errors: Mapping[str, Any],
    windows: Sequence[tuple[int, int]] | None = None,
    *,
    channels: Sequence[str] | None = None,
    prefix: str = "rollout_",
) -> dict[str, float]:
    """Flatten per-lead errors into named scalars, e.g. for a monitored metric.

    For each error `name` (an array `(H, C)`, or `(H, n_bins, C)` for `"spectral"`):

    - `f"{prefix}{name}"`: the mean over every lead and channel;
    - `f"{prefix}{name}_lead_{a}_{b}"`: the mean over leads `a..b` (each window);
    - `f"{prefix}{name}_{channel}"` and `..._{channel}_lead_{a}_{b}`: the same per channel
      when there is more than one;
    - for `"spectral"`, `f"{prefix}spectral_bin{j}"` and `..._bin{j}_lead_{a}_{b}`
      per wavenumber bin (low to high), averaged over channels.

    Args:
        errors: what `rollout_errors` returns.
        windows: lead windows (default `lead_windows(H)`).
        channels: channel names (default `"c0"`, `"c1"`, ...).
        prefix: prepended to every name (e.g. `"val_rollout_"`).

    Returns:
        `{name: float}`.

    Examples:
        >>> import numpy as np
        >>> from pipekit_train.core.metrics import summarize
        >>> errors = {"nrmse": np.linspace(0.1, 1.0, 20)[:, None]}  # (H=20, C=1)
        >>> sorted(summarize(errors, prefix="val_rollout_"))
        ['val_rollout_nrmse', 'val_rollout_nrmse_lead_11_20', 'val_rollout_nrmse_lead_1_10']
    """
    if not isinstance(prefix, str) or (prefix and not _NAME.match(prefix)):
        raise ConfigError(
            f"`prefix` must be letters, digits, '_', '.' or '-'. Received: prefix={prefix!r}."
        )
    out: dict[str, float] = {}
    for name, value in errors.items():
        arr = np.asarray(value, dtype=np.float64)
        if arr.ndim < 2:
            raise ConfigError(
                f"`errors[{name!r}]` must be per lead and channel, (H, C). Received: shape "
                f"{arr.shape}. Pass what rollout_errors returns."
            )
        wins = lead_windows(arr.shape[0]) if windows is None else list(windows)
        means = window_means(arr, wins)
        c = arr.shape[-1]
        names = list(channels) if channels is not None else [f"c{i}" for i in range(c)]
        if len(names) != c:
            raise ConfigError(
                f"`channels` must name each of the {c} channels. Received: channels={names!r}."
            )
        base = f"{prefix}{name}"
        out[base] = float(arr.mean())
        for (a, b), m in means.items():
            out[f"{base}_lead_{a}_{b}"] = float(np.mean(m))
        if arr.ndim == 3:  # spectral: (H, n_bins, C)
            for j in range(arr.shape[1]):
                out[f"{base}_bin{j}"] = float(arr[:, j].mean())
                for (a, b), m in means.items():
                    out[f"{base}_bin{j}_lead_{a}_{b}"] = float(m[j].mean())
        elif c > 1:
            for i, channel in enumerate(names):
                out[f"{base}_{channel}"] = float(arr[:, i].mean())
                for (a, b), m in means.items():
                    out[f"{base}_{channel}_lead_{a}_{b}"] = float(m[i])
    return out


def valid_prediction_time(errors: Any, threshold: float, *, dt: float = 1.0) -> Any:
    """How long an error stays at or below `threshold`: `dt` times the valid leads.

    The number of valid leads is the largest `L` such that the errors at leads `1..L`
    are all `<= threshold`, so the first lead whose error exceeds it is `L + 1` (the
    definition of Vlachas et al. 2020). A rollout whose error never exceeds the
    threshold gets the full horizon `H * dt` (a lower bound: a longer rollout may show
    more). NaN errors count as exceeding.

    Args:
        errors: normalised errors with the lead on the last axis, `(..., H)` (e.g. the
            nRMSE of each start, or its mean); transpose `(H, C)` arrays first.
        threshold: the largest acceptable error (e.g. 0.5 for nRMSE).
        dt: the time one lead represents (e.g. 0.05 for one Lorenz-96 emulator step;
            divide by the Lyapunov time for Lyapunov units).

    Returns:
        A float, or an array of the leading shape.

    Examples:
        >>> import numpy as np
        >>> from pipekit_train.core.metrics import valid_prediction_time
        >>> valid_prediction_time(np.array([0.1, 0.3, 0.6, 0.2]), 0.5, dt=0.05)
        0.1
    """
    e = np.asarray(errors, dtype=np.float64)
    if e.ndim < 1 or e.shape[-1] < 1:
        raise ConfigError(
            f"`errors` must have a lead axis last. Received: errors with shape {e.shape}."
        )
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.number)):
        raise ConfigError(f"`threshold` must be a number. Received: threshold={threshold!r}.")
    if isinstance(dt, bool) or not isinstance(dt, (int, float, np.number)) or not dt > 0:
        raise ConfigError(f"`dt` must be a positive number. Received: dt={dt!r}.")
    exceeded = ~(e <= threshold)
    valid = np.where(exceeded.any(axis=-1), exceeded.argmax(axis=-1), e.shape[-1])
    result = valid * float(dt)
    return float(result) if np.ndim(result) == 0 else result
