"""`SegmentedRollout`: what a device rollout stores and how it is cut into segments.

(Named `RolloutPlan` before; that name is kept as an alias. A *plan* in core is the
frozen description of a training run, `pipekit_train.core.spec.Plan`.)

A backend's device rollout (`model_op.rollout`) advances a batch of states on the
model's device in *segments* of at most `chunk` steps: one compiled scan (jax) or one
no-grad loop (torch) per segment, with the states it stores and a finiteness flag
coming back to the host once per segment. `drive` runs the segments through a backend's
`run_segment` and assembles the stored states; the per-step math is `RolloutSpec.bind`.

`keep` says which states come back: `"all"` (steps `0..n`, like `Cycle`), an int `k`
(steps `0, k, 2k, ...`) or `"last"` (step `n` only). Memory on the device is bounded by
one segment: a 100k-step rollout with `keep="last"` never holds more than `chunk` states.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipekit_train.core._checks import check_seed
from pipekit_train.core._errors import ConfigError

from ._step import non_finite_error

__all__ = [
    "SEGMENT_BYTES",
    "RolloutPlan",
    "SegmentedRollout",
    "check_hook_steps",
    "drive",
    "first_bad",
    "prepare_rollout",
]

#: The default bound on the bytes of the states one segment stores on the device.
SEGMENT_BYTES = 64 * 2**20


def _positive_int(value: Any, name: str, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"`{name}` must be a positive int. Received: {name}={value!r}. {fix}")
    return int(value)


@dataclass(frozen=True)
class SegmentedRollout:
    """The steps of a rollout, what it stores and its segments.

    Attributes:
        n_steps: the number of steps.
        keep: `"all"`, `"last"` or the stride `k` of the stored steps.
        stride: the distance between stored steps (`n_steps` for `"last"`).
        chunk: the most steps one segment runs (a multiple of `stride` for an int `keep`).
    """

    n_steps: int
    keep: str | int
    stride: int
    chunk: int

    @classmethod
    def create(
        cls, n_steps: Any, keep: Any = "all", chunk: Any = None, *, batch_bytes: int = 0
    ) -> SegmentedRollout:
        """Validate the options (before any work) and choose the segment length.

        Args:
            n_steps: a positive int.
            keep: `"all"`, `"last"` or a positive int `k` (store every `k`-th step).
            chunk: the most steps per segment (None: as many as keep the stored states of
                one segment under `SEGMENT_BYTES`); with an int `keep` a multiple of it.
            batch_bytes: the bytes of one batch of states (for the default `chunk`).

        Raises:
            ConfigError: an option is out of range.
        """
        n = _positive_int(n_steps, "n_steps", "Pass the number of steps to roll out.")
        if keep in ("all", "last"):
            stride = 1
        elif isinstance(keep, (int, np.integer)) and not isinstance(keep, bool) and keep >= 1:
            stride = min(int(keep), n)
            keep = int(keep)
        else:
            raise ConfigError(
                "`keep` must be 'all', 'last' or a positive int k (store every k-th step). "
                f"Received: keep={keep!r}."
            )
        if chunk is None:
            fit = max(1, SEGMENT_BYTES // max(1, batch_bytes))
            chunk = min(n, max(stride, (fit // stride) * stride))
        else:
            chunk = _positive_int(chunk, "chunk", "Pass the most steps per device segment.")
            if chunk % stride:
                raise ConfigError(
                    f"`chunk` must be a multiple of `keep` so that every segment stores the "
                    f"same steps. Received: chunk={chunk}, keep={keep}. Use chunk="
                    f"{max(stride, chunk // stride * stride)}."
                )
        return cls(n, keep, stride, chunk)

    def segments(self, start: int = 0, stop: int | None = None) -> list[tuple[int, int, int]]:
        """`(first_step, length, stride)` of the segments covering steps `start+1 .. stop`.

        Every segment but the last is `chunk` steps long; with `keep="last"` each segment
        stores only its final state (its stride is its length).
        """
        stop = self.n_steps if stop is None else stop
        out = []
        step = start
        while step < stop:
            length = min(self.chunk, stop - step)
            out.append((step, length, length if self.keep == "last" else self.stride))
            step += length
        return out

    @property
    def kept_steps(self) -> np.ndarray:
        """The steps whose states the rollout returns, in order."""
        if self.keep == "last":
            return np.array([self.n_steps])
        return np.arange(0, self.n_steps + 1, self.stride)


def check_hook_steps(hook_steps: Any, n_steps: int) -> list[int]:
    """The steps at which a hook runs: an int `m` (every `m` steps) or increasing steps in `[1, n]`.

    Raises:
        ConfigError: a step is outside `[1, n_steps]` or the steps are not increasing.
    """
    if isinstance(hook_steps, (int, np.integer)) and not isinstance(hook_steps, bool):
        m = _positive_int(hook_steps, "hook_steps", "Pass every how many steps the hook runs.")
        return list(range(m, n_steps + 1, m))
    try:
        steps = [s for s in np.asarray(hook_steps).ravel().tolist()]
    except (TypeError, ValueError):
        steps = None
    if (
        steps is None
        or not steps
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in steps)
    ):
        raise ConfigError(
            "`hook_steps` must be a positive int m (every m steps) or a non-empty sequence of "
            f"int steps. Received: hook_steps={hook_steps!r}."
        )
    bad = [s for s in steps if not 1 <= s <= n_steps]
    if bad:
        raise ConfigError(
            f"`hook_steps` must lie in [1, n_steps] = [1, {n_steps}]. Received: "
            f"hook_steps={steps[:10]}{' ...' if len(steps) > 10 else ''} with {bad[:5]} outside. "
            "Drop those steps or raise `n_steps`."
        )
    if any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
        raise ConfigError(
            f"`hook_steps` must be strictly increasing. Received: hook_steps={steps[:10]}"
            f"{' ...' if len(steps) > 10 else ''}. Sort them and drop repeats."
        )
    return steps


RolloutPlan = SegmentedRollout
"""The former name of `SegmentedRollout`, kept for code that imports it."""

#: `run_segment(x, first_step, length, stride) -> (x_after, stored, bad)`: advance the
#: device batch `x` by `length` steps; `stored` holds the states at the segment's steps
#: `stride, 2*stride, ...` (`length // stride` rows, any array the backend's `to_numpy`
#: reads); `bad` is None, or `(local_step, member)` of the first non-finite state (steps
#: counted from 1 within the segment), or a device value `to_bad` turns into that.
SegmentRunner = Callable[[Any, int, int, int], tuple[Any, Any, Any]]


def drive(
    segmented: SegmentedRollout,
    x0: np.ndarray,
    device_x0: Any,
    run_segment: SegmentRunner,
    to_numpy: Callable[[Any], np.ndarray],
    *,
    to_bad: Callable[[Any], tuple[int, int] | None] = lambda bad: bad,
    single: bool = False,
    dtype: Any = None,
) -> np.ndarray:
    """Run `segmented`'s segments through `run_segment`; return the stored states on the host.

    Args:
        segmented: the rollout's steps and segments.
        x0: the initial batch of states (numpy, `(n, *state)`).
        device_x0: the same batch on the model's device.
        run_segment: the backend's segment (see `SegmentRunner`).
        to_numpy: a device array to numpy.
        to_bad: a segment's `bad` value to `(local_step, member)` or None (one transfer).
        single: drop the batch axis (the caller passed one state).
        dtype: the dtype of the result (default: the device's).

    Returns:
        The states at `segmented.kept_steps`, shape `(len(kept_steps), n, *state)` (without
        `n` when `single`).

    Raises:
        NonFiniteStateError: a state became NaN or infinite; the message names the first
            bad step and ensemble member.
    """
    kept = segmented.kept_steps
    out: np.ndarray | None = None
    row = 0 if segmented.keep == "last" else 1
    x = device_x0
    for first, length, stride in segmented.segments():
        x, stored, bad = run_segment(x, first, length, stride)
        where = to_bad(bad)
        if where is not None:
            step, member = where
            raise non_finite_error(first + int(step), "forward", int(member))
        if segmented.keep == "last" and first + length < segmented.n_steps:
            continue
        if length // stride:
            block = np.asarray(to_numpy(stored))
            if out is None:
                out = np.empty((len(kept), *x0.shape), dtype=dtype or block.dtype)
            out[row : row + len(block)] = block
            row += len(block)
    if out is None:
        out = np.empty((len(kept), *x0.shape), dtype=dtype or x0.dtype)
    if segmented.keep != "last":
        out[0] = x0
    assert row == len(kept), (row, len(kept))
    return out[:, 0] if single else out


def first_bad(finite: np.ndarray) -> tuple[int, int] | None:
    """`(step, member)` (step from 1) of the first False in a `(steps, members)` array, or None."""
    if finite.all():
        return None
    step = int(np.argmin(finite.all(axis=1)))
    return step + 1, int(np.argmin(finite[step]))


def prepare_rollout(
    state: Any,
    n_steps: Any,
    spec: Any,
    keep: Any,
    chunk: Any,
    *,
    itemsize: int = 4,
    stochastic: Any = False,
    seed: Any = 0,
) -> tuple[Any, np.ndarray, bool, SegmentedRollout]:
    """Validate a device rollout's arguments before any work.

    `stochastic` must be a bool (True: sample each step; refused on a point head) and
    `seed` a valid seed.

    Returns:
        `(spec, x0, single, segmented)`: the `RolloutSpec` (a plain one for `spec=None`), the
        initial states as a batch `(n, *state)`, whether one state was passed, its `SegmentedRollout`.

    Raises:
        ConfigError: a bad spec, state, `n_steps`, `keep` or `chunk`.
    """
    from ._step import RolloutSpec

    if spec is None:
        spec = RolloutSpec()
    if not isinstance(spec, RolloutSpec):
        raise ConfigError(
            "`spec` must be a `RolloutSpec` (what `NeuralForward.rollout_spec()` returns) or "
            f"None. Received: spec={type(spec).__name__}."
        )
    if not isinstance(stochastic, bool):
        raise ConfigError(
            f"`stochastic` must be True or False. Received: stochastic={stochastic!r}."
        )
    if stochastic:
        spec.check_stochastic()
    check_seed(seed)
    x0 = spec.check_state(state)
    single = x0.shape[0] == 1 and np.ndim(state) == spec.state_ndim
    segmented = SegmentedRollout.create(n_steps, keep, chunk, batch_bytes=int(x0.size) * itemsize)
    return spec, x0, single, segmented
