"""`TrajectoryWindows`: training samples of `k + 1` states cut out of trajectories.

Window `w` of trajectory `i` starts at time `w * stride`; its current time is
`t = w * stride + (history - 1) * step`, and it holds the states at
`t - (history - 1) step, ..., t, t + step, ..., t + k * step`. The sample is

- `"x"`: the model's input at `t` (`ModelInputs`): the state at `t`, `state_shape`, for
  a model of the state alone; with `history > 1`, forcings or static inputs, the last
  `history` states, the forcings at `t` and the static inputs concatenated on the
  channel axis, `(*spatial, C_in)`;
- `"y"`: the `k` following states stacked on a new leading axis, `(k, *state_shape)`
  (a batch: `(B, k, *state_shape)`), or, with `k = 1` and `stack=None` (the default),
  the next state itself, `state_shape`, so one-step training is unchanged. With
  `targets="increments"` each state is replaced by its change over the previous one
  (`y[j] = s[t + (j+1) step] - s[t + j step]`), the residual target;
- `"forcing"` (with forcings and `k > 1`): the forcings of each unrolled step, at the
  times the steps start from (`t + j * step`, `j = 0..k-1`), as blocks
  `(k, *spatial, F)` in raw units: what rollout training feeds step `j`.

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

from ._inputs import ModelInputs
from ._trajectories import Trajectories

__all__ = ["FORCING_KEY", "TrajectoryWindows", "split_trajectories"]

Targets = Literal["states", "increments"]
#: the batch key of the forcings of each unrolled step (rollout training)
FORCING_KEY = "forcing"
_RESERVED = ("x", "y", FORCING_KEY, "noise")


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
        stack: whether `"y"` gets the step axis; None: only when `k > 1` (`False` is for
            `k = 1` only).
        history: the states the model sees, the current one and `history - 1` before it
            (`step` apart), >= 1.

    Raises:
        ConfigError: `k`, `stride`, `step` or `history` below 1, a window (with its
            history) longer than the trajectories, a bad `targets`, an extra input named
            `"x"`, `"y"`, `"forcing"` or `"noise"`, or one that is neither a vector nor a
            field on the state's grid.

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
        history: int = 1,
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
        self.history = _check_count(
            "history", history, "Use history=1 for a model of the current state alone."
        )
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
                    f"Extra inputs of trajectories cannot be named {list(_RESERVED)} (the "
                    f"windows' own keys). Received: an extra input {key!r}. Rename it."
                )
        span = (self.history - 1 + self.k) * self.step + 1
        length = trajectories.length
        if span > length:
            most = (length - 1) // self.step - (self.history - 1)
            seen = f" with history={self.history}" if self.history > 1 else ""
            raise ConfigError(
                f"A window of k={self.k} steps of step={self.step}{seen} spans {span} states, "
                f"but the trajectories have T={length}. Received: k={self.k}, step={self.step}"
                + (f", history={self.history}" if self.history > 1 else "")
                + ". Use "
                + (f"k <= {most}" if most >= 1 else "a shorter history")
                + (" (or a smaller step)" if self.step > 1 else "")
                + ", or longer trajectories."
            )
        self.inputs = ModelInputs(
            trajectories.state_shape,
            self.history,
            tuple((k, s.shape) for k, s in trajectories.static_spec.items()),
            tuple((k, s.shape) for k, s in trajectories.forcing_spec.items()),
        )
        self.trajectories: Trajectories = trajectories
        self.targets: Targets = targets
        self.stacked = self.k > 1 if stack is None else stack
        self.windows_per_trajectory = (length - span) // self.stride + 1
        self._offsets = np.arange(self.history + self.k, dtype=np.intp) * self.step

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
        h = self.history
        y = states[:, h:]
        if self.targets == "increments":
            y = y - states[:, h - 1 : -1]
        out: Batch = {"y": y if self.stacked else y[:, 0]}
        inputs = self.inputs
        if inputs.trivial:
            return {"x": states[:, 0], **out}
        dtype = states.dtype
        static = {k: np.asarray(v, dtype) for k, v in static.items()}
        forcings = {k: np.asarray(v[:, h - 1 : -1], dtype) for k, v in forcings.items()}
        block = None
        if inputs.forcings:
            block = inputs.forcing_values(np, forcings, (len(states), self.k))
        x = inputs.assemble(
            np,
            [states[:, j] for j in range(h)],
            static,
            forcing_block=None if block is None else block[:, 0],
        )
        batch: Batch = {"x": x, **out}
        if block is not None and self.k > 1:
            batch[FORCING_KEY] = block
        return batch

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
        spec = {
            "x": ArraySpec(self.inputs.input_shape, trajs.state_dtype),
            "y": ArraySpec((*lead, *trajs.state_shape), trajs.state_dtype),
        }
        if self.inputs.forcings and self.k > 1:
            shape = (self.k, *self.inputs.spatial, self.inputs.forcing_channels)
            spec[FORCING_KEY] = ArraySpec(shape, trajs.state_dtype)
        return spec

    @property
    def keys(self) -> tuple[str, ...]:
        """`("x", "y")`, and `"forcing"` with forcings and `k > 1`."""
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
                **({"history": self.history} if self.history > 1 else {}),
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
            history=self.history,
        )

    def split(self, fractions: Sequence[float], seed: int = 0) -> tuple[TrajectoryWindows, ...]:
        """Split by trajectory (never by window): no trajectory is in two parts."""
        return tuple(self.with_trajectories(t) for t in self.trajectories.split(fractions, seed))

    def normalizer(self, *, per: str = "channel", batch_size: int = 64) -> Any:
        """A `Normalizer` whose `"x"` and `"y"` statistics match these windows' keys.

        `"x"` holds the model input's statistics (`ModelInputs`: the state's for every
        history slot, then each forcing's and static input's); `"y"` increment
        statistics (over `step`) when `targets="increments"`, else state statistics.
        See `fit_trajectory_normalizer`.
        """
        from ._stats import fit_trajectory_normalizer

        return fit_trajectory_normalizer(
            self.trajectories,
            residual=self.targets == "increments",
            step=self.step,
            per=per,
            batch_size=batch_size,
            inputs=self.inputs,
        )

    def __repr__(self) -> str:
        return (
            f"TrajectoryWindows({self.trajectories!r}, k={self.k}, stride={self.stride}, "
            f"step={self.step}, targets={self.targets!r}"
            + (f", history={self.history}" if self.history > 1 else "")
            + f", n={len(self)})"
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
