"""`TrajectoryWindows`: training samples of `k + 1` states cut out of trajectories.

Window `w` of trajectory `i` starts at time `t = w * stride` and holds the states at
`t, t + step, ..., t + k * step`. The sample is

- `"x"`: the state at `t`, `state_shape`;
- `"y"`: the `k` following states stacked on a new leading axis, `(k, *state_shape)`
  (a batch: `(B, k, *state_shape)`), or, with `k = 1` and `stack=None` (the default),
  the next state itself, `state_shape`, so one-step training is unchanged. With
  `targets="increments"` each state is replaced by its change over the previous one
  (`y[j] = s[t + (j+1) step] - s[t + j step]`), the residual target;
- static inputs under their keys, one value per trajectory;
- forcings under their keys at the times each step starts from, `t + j * step` for
  `j = 0..k-1`, stacked like `"y"` (`(k, ...)`, or `(...)` when `"y"` is not stacked).

Windows are ordered trajectory by trajectory; the sample at an index is a pure
function of the trajectories, so `make_batches` over windows resumes exactly.

Over an out-of-core source (a `CachedDataset` read chunk by chunk, of rows or of whole
trajectories) the windows declare a chunk-aware shuffle (`chunk_size`,
`shuffle_window`, as the cache does): a window chunk holds the windows that start in
about one storage chunk (`chunk states // stride` windows, or whole trajectories' worth
when a chunk holds several), so a shuffled epoch reads each storage chunk a few times
instead of once per window. The order stays a pure function of `(seed, epoch)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from pipekit_train.core._checks import is_int
from pipekit_train.core._errors import ConfigError
from pipekit_train.core.data.datasets._dataset import ArraySpec, Batch, Sample, block_rows
from pipekit_train.core.data.datasets._hashing import Hasher

from ._trajectories import Trajectories

__all__ = ["TrajectoryWindows", "split_trajectories"]

Targets = Literal["states", "increments"]
_RESERVED = ("x", "y")


def _check_count(name: str, value: Any, hint: str) -> int:
    if not is_int(value) or value < 1:
        raise ConfigError(f"`{name}` must be an int >= 1. Received: {name}={value!r}. {hint}")
    return int(value)


class TrajectoryWindows:
    """Windows of `k + 1` states over trajectories, as training samples (see the module doc).

    Args:
        trajectories: a `Trajectories` (an array `(n_traj, T, *state_shape)` is wrapped).
        k: the number of steps a window spans (its number of targets), >= 1.
        stride: time steps between the starts of consecutive windows, >= 1.
        step: time steps between consecutive states inside a window (the emulator's step
            in units of the stored time step), >= 1.
        targets: `"states"` (default) or `"increments"` (residual targets).
        stack: whether `"y"` and the forcings get the step axis; None: only when `k > 1`
            (`False` is for `k = 1` only).

    Raises:
        ConfigError: `k`, `stride` or `step` below 1, a window longer than the
            trajectories, a bad `targets`, or an extra input named `"x"` or `"y"`.

    Examples:
        >>> import numpy as np
        >>> from pipekit_train.core.data import TrajectoryWindows
        >>> states = np.random.default_rng(0).normal(size=(6, 50, 20)).astype(np.float32)
        >>> windows = TrajectoryWindows(states, k=4, stride=2)
        >>> len(windows), windows[0]["x"].shape, windows[0]["y"].shape
        (138, (20,), (4, 20))
    """

    def __init__(
        self,
        trajectories: Trajectories | Any,
        k: int = 1,
        *,
        stride: int = 1,
        step: int = 1,
        targets: Targets = "states",
        stack: bool | None = None,
    ) -> None:
        if not isinstance(trajectories, Trajectories):
            if isinstance(trajectories, np.ndarray):
                trajectories = Trajectories(trajectories)
            else:
                raise ConfigError(
                    "`trajectories` must be a `Trajectories` or an array (n_traj, T, ...). "
                    f"Received: trajectories={type(trajectories).__name__}. Wrap a dataset "
                    "with Trajectories.from_dataset(...) or Trajectories.from_rows(...)."
                )
        self.k = _check_count("k", k, "Use k=1 for one-step training, e.g. k=4 for rollouts.")
        self.stride = _check_count("stride", stride, "Use stride=1 for every window.")
        self.step = _check_count("step", step, "Use step=1 to take consecutive stored states.")
        if targets not in ("states", "increments"):
            raise ConfigError(
                "`targets` must be 'states' or 'increments'. "
                f"Received: targets={targets!r}. Use 'increments' for residual training."
            )
        if stack is not None and not isinstance(stack, bool):
            raise ConfigError(f"`stack` must be a bool or None. Received: stack={stack!r}.")
        if stack is False and self.k > 1:
            raise ConfigError(
                f"`stack=False` keeps one target, but a window of k={self.k} steps has {self.k}. "
                "Received: stack=False. Leave stack=None (stacked when k > 1), or use k=1."
            )
        for key in (*trajectories.static_keys, *trajectories.forcing_keys):
            if key in _RESERVED:
                raise ConfigError(
                    f"Extra inputs of trajectories cannot be named 'x' or 'y' (the windows' "
                    f"state and targets). Received: an extra input {key!r}. Rename it."
                )
        span = self.k * self.step + 1
        length = trajectories.length
        if span > length:
            most = (length - 1) // self.step
            raise ConfigError(
                f"A window of k={self.k} steps of step={self.step} spans {span} states, but the "
                f"trajectories have T={length}. Received: k={self.k}, step={self.step}. Use "
                f"k <= {most}"
                + (" (or a smaller step)" if self.step > 1 else "")
                + ", or longer trajectories."
            )
        self.trajectories: Trajectories = trajectories
        self.targets: Targets = targets
        self.stacked = self.k > 1 if stack is None else stack
        self.windows_per_trajectory = (length - span) // self.stride + 1
        self._offsets = np.arange(self.k + 1, dtype=np.intp) * self.step

    # -- the chunk-aware shuffle of an out-of-core source ------------------------------
    @property
    def chunk_size(self) -> int | None:
        """Windows per shuffle chunk over an out-of-core source (else None: a full shuffle)."""
        layout = self.trajectories.chunk_states
        if layout is None:
            return None
        states, length = layout[0], self.trajectories.length
        if states >= length:
            return (states // length) * self.windows_per_trajectory
        return min(self.windows_per_trajectory, max(1, states // self.stride))

    @property
    def shuffle_window(self) -> int | None:
        """Shuffle chunks per window (the source's), or None."""
        layout = self.trajectories.chunk_states
        return None if layout is None else layout[1]

    # -- the dataset protocol ------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.trajectories) * self.windows_per_trajectory

    def locate(self, indices: np.ndarray | Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """`(trajectory item, start time)` of each window index."""
        idx = np.asarray(indices, dtype=np.int64)
        n = len(self)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise IndexError(f"window indices out of range for {n} windows")
        per = self.windows_per_trajectory
        return idx // per, (idx % per) * self.stride

    def trajectory_ids(self, indices: np.ndarray | Sequence[int]) -> np.ndarray:
        """The source trajectory (`Trajectories.ids`) each window at `indices` comes from."""
        items, _ = self.locate(indices)
        return self.trajectories.ids[items]

    def get_batch(self, indices: np.ndarray) -> Batch:
        """The windows at `indices` as one batch (one gather of states per batch)."""
        items, starts = self.locate(indices)
        times = starts[:, None] + self._offsets[None, :]
        states, static, forcings = self.trajectories.window(items, times)
        y = states[:, 1:]
        if self.targets == "increments":
            y = y - states[:, :-1]
        out: Batch = {"x": states[:, 0], "y": y if self.stacked else y[:, 0]}
        out.update(static)
        for key, value in forcings.items():
            out[key] = value[:, :-1] if self.stacked else value[:, 0]
        return out

    def __getitem__(self, index: int) -> Sample:
        i = int(index)
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {index} is out of range for {len(self)} windows")
        return {k: v[0] for k, v in self.get_batch(np.array([i % len(self)])).items()}

    @property
    def element_spec(self) -> dict[str, ArraySpec]:
        """Shape and dtype per key of one window."""
        trajs = self.trajectories
        lead = (self.k,) if self.stacked else ()
        return {
            "x": ArraySpec(trajs.state_shape, trajs.state_dtype),
            "y": ArraySpec((*lead, *trajs.state_shape), trajs.state_dtype),
            **trajs.static_spec,
            **{k: ArraySpec((*lead, *s.shape), s.dtype) for k, s in trajs.forcing_spec.items()},
        }

    @property
    def keys(self) -> tuple[str, ...]:
        """`("x", "y", *static keys, *forcing keys)`."""
        return tuple(self.element_spec)

    @property
    def gather_block_rows(self) -> int | None:
        """Windows `make_batches` may gather at once (in-memory trajectories only)."""
        return block_rows(self.element_spec) if self.trajectories.in_memory else None

    def fingerprint(self) -> str:
        """SHA-256 of the trajectories' fingerprint and the window settings."""
        h = Hasher("TrajectoryWindows")
        h.update_json(self.trajectories.fingerprint())
        h.update_json(
            {
                "k": self.k,
                "stride": self.stride,
                "step": self.step,
                "targets": self.targets,
                "stacked": self.stacked,
            }
        )
        return h.hexdigest()

    # -- views -------------------------------------------------------------------------------
    def with_trajectories(self, trajectories: Trajectories) -> TrajectoryWindows:
        """The same window settings over other trajectories."""
        return TrajectoryWindows(
            trajectories,
            self.k,
            stride=self.stride,
            step=self.step,
            targets=self.targets,
            stack=self.stacked,
        )

    def split(self, fractions: Sequence[float], seed: int = 0) -> tuple[TrajectoryWindows, ...]:
        """Split by trajectory (never by window): no trajectory is in two parts."""
        return tuple(self.with_trajectories(t) for t in self.trajectories.split(fractions, seed))

    def normalizer(self, *, per: str = "channel", batch_size: int = 64) -> Any:
        """A `Normalizer` whose `"x"` and `"y"` statistics match these windows' keys.

        `"y"` holds increment statistics (over `step`) when `targets="increments"`, else
        state statistics. See `fit_trajectory_normalizer`.
        """
        from ._stats import fit_trajectory_normalizer

        return fit_trajectory_normalizer(
            self.trajectories,
            residual=self.targets == "increments",
            step=self.step,
            per=per,
            batch_size=batch_size,
        )

    def __repr__(self) -> str:
        return (
            f"TrajectoryWindows({self.trajectories!r}, k={self.k}, stride={self.stride}, "
            f"step={self.step}, targets={self.targets!r}, n={len(self)})"
        )


def split_trajectories(
    data: Trajectories | TrajectoryWindows, fractions: Sequence[float], seed: int = 0
) -> tuple[Any, ...]:
    """Split trajectories, or windows over them, by trajectory: no leakage between parts.

    The trajectories are permuted and cut as `data.split` cuts samples (the same seed
    gives the same parts); windows are rebuilt over each part with the same settings.

    Args:
        data: a `Trajectories` or a `TrajectoryWindows`.
        fractions: positive fractions of the trajectories, summing to at most 1.
        seed: a non-negative int.

    Returns:
        One object of `data`'s type per fraction.

    Raises:
        ConfigError: `data` is neither, or the fractions are invalid (as for `split`).
    """
    if not isinstance(data, (Trajectories, TrajectoryWindows)):
        raise ConfigError(
            "`data` must be `Trajectories` or `TrajectoryWindows`. Received: "
            f"data={type(data).__name__}. Use data.split(...) to split samples of another dataset."
        )
    return data.split(fractions, seed)
