"""Checks shared by the diagnostics: array shapes, sizes and levels, before any work.

The axis order is one everywhere: posterior samples first. `samples` is
`(num_samples, num_simulations, num_parameters)` — `S` draws from the posterior of each of
`N` simulated observations — and `theta` is `(num_simulations, num_parameters)`, the
parameters each observation was simulated from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pipekit_train.core._checks import is_int
from pipekit_train.core._errors import ConfigError

__all__ = [
    "MIN_POSTERIOR_SAMPLES",
    "MIN_SIMULATIONS",
    "check_levels",
    "check_parameter_names",
    "check_probability",
    "check_ranks",
    "check_samples_and_theta",
]

#: The fewest simulations a rank diagnostic accepts: a chi-squared test on 4 bins with 5
#: expected ranks in each; fewer ranks cannot tell a calibrated posterior from a bad one.
MIN_SIMULATIONS = 20
#: The fewest posterior draws per simulation: ranks in 0..S resolve levels in steps of
#: 1/(S + 1), so 20 draws read the 95% level to within 0.05.
MIN_POSTERIOR_SAMPLES = 20


def _finite(name: str, array: np.ndarray) -> None:
    if not np.all(np.isfinite(array)):
        bad = int(np.size(array) - np.count_nonzero(np.isfinite(array)))
        raise ConfigError(
            f"`{name}` must hold finite numbers. Received: {bad} NaN/inf values in "
            f"{name} of shape {array.shape}. Drop the simulations (or draws) that produced them."
        )


def check_samples_and_theta(samples: Any, theta: Any) -> tuple[np.ndarray, np.ndarray]:
    """`samples` `(S, N, D)` and `theta` `(N, D)` as float64 arrays, checked.

    A single parameter may drop its axis: `samples` `(S, N)` with `theta` `(N,)`.

    Raises:
        ConfigError: wrong ranks, mismatched `N` or `D`, too few simulations or draws,
            non-finite values.
    """
    s = np.asarray(samples, dtype=np.float64)
    t = np.asarray(theta, dtype=np.float64)
    if s.ndim == 2 and t.ndim == 1:
        s, t = s[..., None], t[:, None]
    if s.ndim != 3 or t.ndim != 2:
        raise ConfigError(
            "`samples` must be (num_samples, num_simulations, num_parameters) and `theta` "
            "(num_simulations, num_parameters), samples first. Received: "
            f"samples.shape={s.shape}, theta.shape={t.shape}."
        )
    if s.shape[1:] != t.shape:
        raise ConfigError(
            "`samples` and `theta` must agree on (num_simulations, num_parameters). "
            f"Received: samples.shape={s.shape}, theta.shape={t.shape}. Draw "
            "samples[:, i] from the posterior of the observation simulated from theta[i]."
        )
    if t.shape[0] < MIN_SIMULATIONS:
        raise ConfigError(
            f"Calibration diagnostics need at least {MIN_SIMULATIONS} simulations. Received: "
            f"num_simulations={t.shape[0]} (theta.shape={t.shape}). Simulate more (a few "
            "hundred give a usable test; 1000 read coverage to about ±0.03)."
        )
    if s.shape[0] < MIN_POSTERIOR_SAMPLES:
        raise ConfigError(
            f"Calibration diagnostics need at least {MIN_POSTERIOR_SAMPLES} posterior draws "
            f"per simulation. Received: num_samples={s.shape[0]} (samples.shape={s.shape}). "
            "Draw more (100 or more is usual)."
        )
    _finite("samples", s)
    _finite("theta", t)
    return s, t


def check_ranks(ranks: Any, num_samples: Any) -> tuple[np.ndarray, int]:
    """`ranks` `(N, D)` (or `(N,)`) as int64 in `0..num_samples`, checked."""
    if not is_int(num_samples) or num_samples < MIN_POSTERIOR_SAMPLES:
        raise ConfigError(
            f"`num_samples` must be the number of posterior draws the ranks count, an int "
            f">= {MIN_POSTERIOR_SAMPLES}. Received: num_samples={num_samples!r}."
        )
    r = np.asarray(ranks)
    if r.ndim == 1:
        r = r[:, None]
    if r.ndim != 2 or not np.issubdtype(r.dtype, np.integer):
        raise ConfigError(
            "`ranks` must be integer ranks (num_simulations, num_parameters), e.g. from "
            f"sbc_ranks. Received: ranks of shape {r.shape} and dtype {r.dtype}."
        )
    if r.shape[0] < MIN_SIMULATIONS:
        raise ConfigError(
            f"Calibration diagnostics need at least {MIN_SIMULATIONS} simulations. Received: "
            f"num_simulations={r.shape[0]} (ranks.shape={r.shape}). Simulate more."
        )
    if r.size and (r.min() < 0 or r.max() > num_samples):
        raise ConfigError(
            f"`ranks` must lie in 0..num_samples. Received: ranks in {int(r.min())}.."
            f"{int(r.max())} with num_samples={num_samples}. Pass the number of posterior "
            "draws the ranks were counted among."
        )
    return r.astype(np.int64), int(num_samples)


def check_probability(name: str, value: Any) -> float:
    """`value` as a float strictly inside (0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)):
        ok = False
    else:
        ok = 0.0 < float(value) < 1.0
    if not ok:
        raise ConfigError(
            f"`{name}` must be a probability in (0, 1). Received: {name}={value!r}. Use e.g. 0.05."
        )
    return float(value)


def check_levels(levels: Any, *, name: str = "levels") -> np.ndarray:
    """Credibility levels as a float64 vector inside (0, 1)."""
    lv = np.atleast_1d(np.asarray(levels, dtype=np.float64))
    if lv.ndim != 1 or lv.size == 0 or not np.all((lv > 0) & (lv < 1)):
        raise ConfigError(
            f"`{name}` must be credibility levels in (0, 1). Received: {name}={levels!r}. "
            "Use e.g. (0.5, 0.68, 0.95)."
        )
    return lv


def check_parameter_names(names: Sequence[str] | None, count: int) -> tuple[str, ...]:
    """`names` checked against `count` parameters, or `theta_0 … theta_{count-1}`."""
    if names is None:
        return tuple(f"theta_{j}" for j in range(count))
    if isinstance(names, str):
        names = [names]
    out = tuple(str(n) for n in names)
    if len(out) != count:
        raise ConfigError(
            f"`parameter_names` must name each of the {count} parameters. Received: "
            f"parameter_names={list(names)!r} ({len(out)} names)."
        )
    return out
