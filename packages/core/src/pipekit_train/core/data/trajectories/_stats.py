"""Per-channel statistics of trajectories' states and increments, as a `Normalizer`."""

from __future__ import annotations

import numpy as np

from pipekit_train.core._checks import positive_int
from pipekit_train.core._errors import ConfigError
from pipekit_train.core.data._normalizer import Normalizer

from ._inputs import ModelInputs
from ._trajectories import Trajectories

__all__ = ["fit_trajectory_normalizer"]

_CONSTANT_RTOL = 1e-7  # as `Normalizer.fit`: std below this fraction of |mean| is a constant


class _Moments:
    """Count, mean and sum of squared deviations, merged with Chan's parallel update."""

    def __init__(self) -> None:
        self.count = 0
        self.mean: np.ndarray | None = None
        self.m2: np.ndarray | None = None

    def add(self, x: np.ndarray, axes: tuple[int, ...]) -> None:
        b = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
        b_mean = x.mean(axis=axes)
        b_m2 = np.square(x - np.expand_dims(b_mean, axes)).sum(axis=axes)
        if self.mean is None or self.m2 is None:
            self.count, self.mean, self.m2 = b, b_mean, b_m2
            return
        total = self.count + b
        delta = b_mean - self.mean
        self.mean = self.mean + delta * (b / total)
        self.m2 = self.m2 + b_m2 + np.square(delta) * (self.count * b / total)
        self.count = total

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        assert self.mean is not None and self.m2 is not None
        std = np.sqrt(self.m2 / self.count)
        constant = (std == 0) | (std <= _CONSTANT_RTOL * np.abs(self.mean))
        return self.mean, np.where(constant, 1.0, std)


_READ_ELEMENTS = 1 << 23  # states read per step of the pass (64 MiB in float64)


def _channel_axes(x: np.ndarray, value_ndim: int, keep: int) -> tuple[int, ...]:
    """The axes pooled over: every leading axis, and a value's own axes but the last
    `keep` (`keep = 1`: per channel; a vector value keeps its one axis)."""
    return tuple(range(x.ndim - min(keep, max(value_ndim, 1))))


def fit_trajectory_normalizer(
    trajectories: Trajectories,
    *,
    residual: bool = True,
    step: int = 1,
    per: str = "channel",
    batch_size: int = 64,
    inputs: ModelInputs | None = None,
) -> Normalizer:
    """Fit a `Normalizer` of the model's inputs (`"x"`) and targets (`"y"`).

    `"x"` holds the mean and std of the states; `"y"` those of the increments over
    `step` stored time steps (`s[t + step] - s[t]`) when `residual=True`, else of the
    states again. These are the keys `NeuralForward` (and `TrainingLoop`) use: inputs
    normalised as `"x"`, the model's output de-normalised as `"y"` and, with
    `NeuralForward(..., residual=True)`, added to the state. The result is a plain core
    `Normalizer`, so it is registered with the model and read back by
    `NeuralForward.from_record` like any other.

    With `inputs` (a `ModelInputs` with history, forcings or static inputs: what
    `TrajectoryWindows.normalizer()` passes) `"x"` holds the statistics of the model's
    whole input in its layout: the states' for every history slot, then each forcing's
    and each static input's own.

    With `per="channel"` (default) the statistics have shape `(C,)` (the last axis of a
    state), pooled over time, trajectories and every grid point (a translation-invariant
    normalisation of channels-last fields); they broadcast over any leading shape, so the
    same normalizer applies to one state, a batch, or a stack of `k` targets. With
    `per="feature"` they have the state's full shape (one pair per grid point and channel).

    The pass streams `batch_size` trajectories at a time, and long trajectories in
    pieces along time, in float64 (Chan's update). Constant channels get std 1 (as
    `Normalizer.fit`).

    Args:
        trajectories: the training trajectories (fit on the training split only).
        residual: `"y"` from increments (True) or from states (False).
        step: the increment's time step, in stored time steps (the windows' `step`).
        per: `"channel"` or `"feature"`.
        batch_size: trajectories read per step of the pass.
        inputs: the model input's layout (None: the state alone).

    Raises:
        ConfigError: a bad argument, `step` not shorter than the trajectories, or
            non-finite states or extra inputs.
    """
    if not isinstance(trajectories, Trajectories):
        raise ConfigError(
            "`trajectories` must be a `Trajectories`. Received: "
            f"trajectories={type(trajectories).__name__}. Wrap arrays as Trajectories(states)."
        )
    if not isinstance(residual, bool):
        raise ConfigError(f"`residual` must be a bool. Received: residual={residual!r}.")
    step = positive_int("step", step)
    batch_size = positive_int("batch_size", batch_size)
    if per not in ("channel", "feature"):
        raise ConfigError(
            f"`per` must be 'channel' or 'feature'. Received: per={per!r}. Use 'channel' for "
            "per-field statistics pooled over the grid."
        )
    if step >= trajectories.length:
        raise ConfigError(
            f"`step` must be shorter than the trajectories. Received: step={step}, but the "
            f"trajectories have T={trajectories.length} states. Use step < {trajectories.length}."
        )
    if inputs is not None and inputs.trivial:
        inputs = None
    state_ndim = len(trajectories.state_shape)
    keep = 1 if per == "channel" else state_ndim
    states_m, target_m = _Moments(), _Moments()
    static_keys = [k for k, _ in inputs.static] if inputs is not None else []
    forcing_keys = [k for k, _ in inputs.forcings] if inputs is not None else []
    extras_m = {key: _Moments() for key in (*forcing_keys, *static_keys)}
    n, length = len(trajectories), trajectories.length
    state_size = int(np.prod(trajectories.state_shape, dtype=np.int64))
    for start in range(0, n, batch_size):
        idx = np.arange(start, min(n, start + batch_size))
        per_read = max(step + 1, _READ_ELEMENTS // max(1, len(idx) * state_size))
        for t0 in range(0, length, per_read):
            t1 = min(length, t0 + per_read)
            first = max(0, t0 - step)  # the states before t0 that increments ending in it need
            times = np.broadcast_to(np.arange(first, t1), (len(idx), t1 - first))
            states, static, forcings = trajectories.window(idx, times)
            x = np.asarray(states, dtype=np.float64)
            if not np.all(np.isfinite(x)):
                raise ConfigError(
                    f"The trajectories {start}..{idx[-1]} have non-finite states. Received: "
                    "NaN or inf. Drop or fix the diverged simulations before fitting."
                )
            axes = tuple(range(x.ndim - keep))
            states_m.add(x[:, t0 - first :], axes)
            if residual and x.shape[1] > step:
                target_m.add(x[:, step:] - x[:, :-step], axes)
            pieces = {k: forcings[k][:, t0 - first :] for k in forcing_keys}
            if t0 == 0:
                pieces.update({k: static[k] for k in static_keys})
            for key, value in pieces.items():
                v = np.asarray(value, dtype=np.float64)
                if not np.all(np.isfinite(v)):
                    raise ConfigError(
                        f"The input {key!r} of trajectories {start}..{idx[-1]} has non-finite "
                        "values. Received: NaN or inf. Fix the data before fitting."
                    )
                lead = 2 if key in forcing_keys else 1
                if v.ndim == lead:  # scalar values: one channel
                    v = v[..., None]
                extras_m[key].add(v, _channel_axes(v, v.ndim - lead, keep))
    mean_x, std_x = states_m.result()
    mean_y, std_y = target_m.result() if residual else (mean_x, std_x)
    if inputs is not None:
        extras = {key: m.result() for key, m in extras_m.items()}
        mean_in, std_in = inputs.input_stats((mean_x, std_x), extras)
        return Normalizer(
            {"x": mean_in, "y": mean_y}, {"x": std_in, "y": std_y}, count=states_m.count
        )
    return Normalizer({"x": mean_x, "y": mean_y}, {"x": std_x, "y": std_y}, count=states_m.count)
