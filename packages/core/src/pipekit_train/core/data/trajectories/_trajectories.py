"""`Trajectories`: a dataset whose item is one trajectory of states, from any of three sources.

A trajectory is `T` consecutive states of one shape (any leading field shape,
channels-last: `(d,)` for a vector, `(H, W, C)` for a 2-D field), plus optional
*static* inputs (one value per trajectory: parameters) and *forcings* (one value per
time step: boundary values, sources). Item `i` is
`{state_key: (T, *state_shape), static...: (...), forcing...: (T, ...)}`.

Three sources, one interface (`window` gathers states at chosen times):

- in-memory arrays `(n_traj, T, *state_shape)` (`Trajectories(states, ...)`);
- an indexable dataset whose item is a trajectory (`Trajectories.from_dataset`): a
  `SimulationDataset` whose simulator returns `(T, ...)`, or a `CachedDataset` built
  from one (one row per trajectory);
- an indexable dataset of *rows*, one state per row, trajectory-major
  (`Trajectories.from_rows`): what `CachedDataset.build(trajs.rows(), uri)` writes, a
  cache chunked along time, so a window reads one or two chunks of a long trajectory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pipekit_train.core._checks import positive_int
from pipekit_train.core._errors import ConfigError
from pipekit_train.core.data.datasets._dataset import (
    ArrayDataset,
    ArraySpec,
    Batch,
    Sample,
    block_rows,
)
from pipekit_train.core.data.datasets._hashing import Hasher
from pipekit_train.core.data.datasets._split import split

from ._sources import ArraySource, DatasetSource, RowSource, check_keys

__all__ = ["TrajectoryRows", "Trajectories"]


class Trajectories:
    """A dataset of trajectories: item `i` is `{state_key: (T, *state_shape), extras...}`.

    Built from arrays here, or with `from_dataset` (a simulator's trajectories) or
    `from_rows` (a cache of states chunked along time). `TrajectoryWindows` cuts
    training windows out of it; `split` divides it by trajectory; `select` keeps some.

    Args:
        states: `(n_traj, T, *state_shape)`, channels-last (`(n, T, d)` for vectors,
            `(n, T, H, W, C)` for 2-D fields), `T >= 2`.
        static: per-trajectory inputs by key, each `(n_traj, ...)` (e.g. parameters).
        forcings: per-time-step inputs by key, each `(n_traj, T, ...)`.
        state_key: the key of the states in an item (default `"x"`).

    Raises:
        ConfigError: a non-numeric or too-small `states`, an extra input whose leading
            axes do not match `(n_traj,)` / `(n_traj, T)`, or clashing keys.

    Examples:
        >>> import numpy as np
        >>> from pipekit_train.core.data import Trajectories
        >>> trajs = Trajectories(np.zeros((8, 100, 20), np.float32),
        ...                      static={"forcing_f": np.full((8, 1), 8.0, np.float32)})
        >>> len(trajs), trajs.length, trajs.state_shape
        (8, 100, (20,))
    """

    def __init__(
        self,
        states: Any,
        *,
        static: Mapping[str, Any] | None = None,
        forcings: Mapping[str, Any] | None = None,
        state_key: str = "x",
    ) -> None:
        arr = np.asarray(states)
        if arr.dtype.kind not in "biuf" or arr.ndim < 3:
            raise ConfigError(
                "`states` must be a real array (n_traj, T, *state_shape) with at least one "
                f"state axis. Received: states with shape {arr.shape} and dtype {arr.dtype}. "
                "Add a trailing channel axis for scalar states, e.g. states[..., None]."
            )
        static_arrays = {k: np.asarray(v) for k, v in (static or {}).items()}
        forcing_arrays = {k: np.asarray(v) for k, v in (forcings or {}).items()}
        check_keys(state_key, tuple(static_arrays), tuple(forcing_arrays))
        n, length = arr.shape[:2]
        for key, value in static_arrays.items():
            if value.ndim < 1 or value.shape[0] != n:
                raise ConfigError(
                    f"`static` inputs need one value per trajectory. Received: static[{key!r}] "
                    f"with shape {value.shape}, but states has n_traj={n}. Pass an array of "
                    f"shape ({n}, ...)."
                )
        for key, value in forcing_arrays.items():
            if value.ndim < 2 or value.shape[:2] != (n, length):
                raise ConfigError(
                    f"`forcings` need one value per trajectory and time step. Received: "
                    f"forcings[{key!r}] with shape {value.shape}, but states has (n_traj, T) = "
                    f"({n}, {length}). Pass an array of shape ({n}, {length}, ...), or put a "
                    "time-independent input in `static`."
                )
        self._init(ArraySource(arr, static_arrays, forcing_arrays), state_key, None)

    def _init(self, source: Any, state_key: str, ids: np.ndarray | None) -> None:
        self._source = source
        self.state_key = state_key
        self._ids = np.arange(source.n, dtype=np.int64) if ids is None else ids
        self._ids.setflags(write=False)
        if source.length < 2:
            raise ConfigError(
                f"A trajectory needs at least 2 states. Received: T={source.length}. "
                "Simulate longer trajectories."
            )
        if self._ids.size == 0:
            raise ConfigError("`Trajectories` must hold at least one trajectory. Received: 0.")
        state, self._static_spec, self._forcing_spec = source.spec()
        self.state_shape: tuple[int, ...] = tuple(state.shape)
        self.state_dtype: np.dtype = np.dtype(state.dtype)

    @classmethod
    def _view(cls, source: Any, state_key: str, ids: np.ndarray | None) -> Trajectories:
        obj = cls.__new__(cls)
        obj._init(source, state_key, ids)
        return obj

    @classmethod
    def from_dataset(
        cls,
        dataset: Any,
        *,
        state_key: str = "x",
        static: Sequence[str] = (),
        forcings: Sequence[str] = (),
    ) -> Trajectories:
        """Trajectories that are the items of an indexable dataset.

        E.g. a `SimulationDataset` whose simulator returns a whole trajectory `(T, ...)`
        (its parameters become a static input: `static=("theta",)`), or a
        `CachedDataset` built from one. Each window reads its trajectory whole: cache a
        simulator first (`CachedDataset.build`) so it is not re-simulated per window.

        Args:
            dataset: an indexable dataset; item `i` holds trajectory `i`.
            state_key: the item key of the states `(T, *state_shape)`.
            static: item keys carried along per trajectory.
            forcings: item keys with one value per time step `(T, ...)`.
        """
        static, forcings = tuple(static), tuple(forcings)
        check_keys(state_key, static, forcings)
        return cls._view(DatasetSource(dataset, state_key, static, forcings), state_key, None)

    @classmethod
    def from_rows(
        cls,
        dataset: Any,
        length: int,
        *,
        state_key: str = "x",
        static: Sequence[str] = (),
        forcings: Sequence[str] = (),
    ) -> Trajectories:
        """Trajectories stored one state per row, trajectory-major (row `i * length + t`).

        The layout `Trajectories.rows()` yields, so `CachedDataset.build(trajs.rows(),
        uri, chunk_size=...)` writes a cache chunked along time and
        `Trajectories.from_rows(cache, length=trajs.length)` reads windows from it, a
        few chunks each, without loading whole trajectories.

        Args:
            dataset: an indexable dataset of `n_traj * length` rows.
            length: the number of states per trajectory (`T`).
            state_key: the row key of the state.
            static: row keys constant along a trajectory (read from a window's first row).
            forcings: row keys with one value per time step.
        """
        length = positive_int("length", length)
        static, forcings = tuple(static), tuple(forcings)
        check_keys(state_key, static, forcings)
        return cls._view(RowSource(dataset, length, state_key, static, forcings), state_key, None)

    @classmethod
    def from_source(cls, source: Any, *, state_key: str = "x") -> Trajectories:
        """Trajectories read from a trajectory source (a field reader, or your own).

        A source has `n` trajectories of `length` states and answers
        `gather(traj (B,), times (B, L)) -> (states (B, L, *state_shape),
        static {key: (B, ...)}, forcings {key: (B, L, ...)})`, `spec() -> (state spec,
        static specs, forcing specs)` (`ArraySpec`s of one state / trajectory value /
        time step), `chunk_states()` (`(states per storage chunk, shuffle window)` of
        an out-of-core layout, or None) and `fingerprint(hasher)`. The readers of
        `pipekit_train.core.data.readers` (The Well's HDF5, xarray) are sources.

        Args:
            source: the trajectory source.
            state_key: the key of the states in an item.

        Raises:
            ConfigError: `source` lacks part of the protocol, or its keys clash.
        """
        missing = [
            name
            for name in ("n", "length", "spec", "gather", "chunk_states", "fingerprint")
            if not hasattr(source, name)
        ]
        if missing:
            raise ConfigError(
                "`source` must be a trajectory source (n, length, spec(), gather(traj, "
                "times), chunk_states(), fingerprint(h)). Received: "
                f"source={type(source).__name__}, which lacks {missing}. Use a reader of "
                "pipekit_train.core.data.readers, or Trajectories(states) for arrays."
            )
        _, static, forcings = source.spec()
        check_keys(state_key, tuple(static), tuple(forcings))
        return cls._view(source, state_key, None)

    # -- shape and content -------------------------------------------------------------
    @property
    def length(self) -> int:
        """The number of states per trajectory (`T`)."""
        return int(self._source.length)

    @property
    def static_keys(self) -> tuple[str, ...]:
        """The keys of the per-trajectory inputs."""
        return tuple(self._static_spec)

    @property
    def forcing_keys(self) -> tuple[str, ...]:
        """The keys of the per-time-step inputs."""
        return tuple(self._forcing_spec)

    @property
    def static_spec(self) -> dict[str, ArraySpec]:
        """Shape and dtype of one trajectory's value, per static key."""
        return dict(self._static_spec)

    @property
    def forcing_spec(self) -> dict[str, ArraySpec]:
        """Shape and dtype of one time step's value, per forcing key."""
        return dict(self._forcing_spec)

    @property
    def ids(self) -> np.ndarray:
        """The source trajectory index of each item (read-only): what `split` divides."""
        return self._ids

    @property
    def chunk_states(self) -> tuple[int, int] | None:
        """`(states per storage chunk, shuffle window in chunks)` of an out-of-core source.

        None for in-memory trajectories or a source without a chunk-aware shuffle (a
        `CachedDataset` loaded whole). `TrajectoryWindows` derives its own chunk-aware
        shuffle from it.
        """
        return self._source.chunk_states()

    @property
    def in_memory(self) -> bool:
        """Whether the trajectories are in-memory arrays (a window is a pure gather)."""
        return isinstance(self._source, ArraySource)

    def window(self, items: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, Batch, Batch]:
        """States and extras of trajectories `items` at `times`.

        Args:
            items: `(B,)` item indices (into this view).
            times: `(B, L)` time indices in `[0, T)`.

        Returns:
            `(states (B, L, *state_shape), static {key: (B, ...)}, forcings {key: (B, L, ...)})`.
        """
        traj = self._ids[np.asarray(items, dtype=np.intp)]
        return self._source.gather(traj, np.asarray(times, dtype=np.intp))

    # -- the dataset protocol ------------------------------------------------------------
    def __len__(self) -> int:
        return int(self._ids.size)

    def get_batch(self, indices: np.ndarray) -> Batch:
        """Whole trajectories at `indices`: `{state_key: (B, T, ...), extras...}`."""
        idx = np.asarray(indices, dtype=np.intp)
        times = np.broadcast_to(np.arange(self.length), (idx.size, self.length))
        states, static, forcings = self.window(idx, times)
        return {self.state_key: states, **static, **forcings}

    def __getitem__(self, index: int) -> Sample:
        i = int(index)
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {index} is out of range for {len(self)} trajectories")
        return {k: v[0] for k, v in self.get_batch(np.array([i % len(self)])).items()}

    @property
    def element_spec(self) -> dict[str, ArraySpec]:
        """Shape and dtype per key of one trajectory."""
        t = self.length
        return {
            self.state_key: ArraySpec((t, *self.state_shape), self.state_dtype),
            **self._static_spec,
            **{k: ArraySpec((t, *s.shape), s.dtype) for k, s in self._forcing_spec.items()},
        }

    @property
    def keys(self) -> tuple[str, ...]:
        """The item keys."""
        return tuple(self.element_spec)

    def fingerprint(self) -> str:
        """SHA-256 of the source (its content or its fingerprint) and the selected ids."""
        h = Hasher("Trajectories")
        self._source.fingerprint(h)
        h.update_json(self.state_key)
        h.update_array(self._ids)
        return h.hexdigest()

    # -- views -----------------------------------------------------------------------------
    def select(self, indices: Sequence[int] | np.ndarray) -> Trajectories:
        """The trajectories at `indices` (into this view), in that order."""
        idx = np.asarray(indices)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise ConfigError(
                "`indices` must be a 1-D array of ints. "
                f"Received: indices with shape {idx.shape} and dtype {idx.dtype}."
            )
        if idx.size and (idx.min() < -len(self) or idx.max() >= len(self)):
            raise ConfigError(
                f"`indices` must lie in [0, {len(self)}). Received: indices from {idx.min()} to "
                f"{idx.max()} for {len(self)} trajectories."
            )
        ids = self._ids[idx.astype(np.intp) % len(self)].astype(np.int64)
        return type(self)._view(self._source, self.state_key, ids)

    def split(self, fractions: Sequence[float], seed: int = 0) -> tuple[Trajectories, ...]:
        """Disjoint random parts by trajectory (the permutation and rules of `data.split`).

        Each part keeps its trajectories in this view's order (sorted), so windows over
        an out-of-core part read neighbouring storage chunks together.
        """
        parts = split(ArrayDataset(i=np.arange(len(self))), fractions, seed)
        return tuple(self.select(np.sort(part.indices)) for part in parts)

    def rows(self) -> TrajectoryRows:
        """A dataset of every state as a row, trajectory-major (for `CachedDataset.build`)."""
        return TrajectoryRows(self)

    def __repr__(self) -> str:
        return (
            f"Trajectories(n={len(self)}, T={self.length}, state_shape={self.state_shape}, "
            f"static={list(self.static_keys)}, forcings={list(self.forcing_keys)})"
        )


class TrajectoryRows:
    """Every state of `trajectories` as one row, trajectory-major: row `i * T + t`.

    Row keys: the state key, the static keys (repeated along the trajectory) and the
    forcing keys (at time `t`). Build a cache chunked along time from it and read it
    back with `Trajectories.from_rows(cache, length=T, ...)`.
    """

    def __init__(self, trajectories: Trajectories) -> None:
        self.trajectories = trajectories

    def __len__(self) -> int:
        return len(self.trajectories) * self.trajectories.length

    def get_batch(self, indices: np.ndarray) -> Batch:
        """The rows at `indices`."""
        idx = np.asarray(indices, dtype=np.int64)
        t = self.trajectories.length
        states, static, forcings = self.trajectories.window(idx // t, (idx % t)[:, None])
        out: Batch = {self.trajectories.state_key: states[:, 0]}
        out.update(static)
        out.update({k: v[:, 0] for k, v in forcings.items()})
        return out

    def __getitem__(self, index: int) -> Sample:
        i = int(index)
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {index} is out of range for {len(self)} rows")
        return {k: v[0] for k, v in self.get_batch(np.array([i % len(self)])).items()}

    @property
    def element_spec(self) -> dict[str, ArraySpec]:
        """Shape and dtype per key of one row."""
        trajs = self.trajectories
        return {
            trajs.state_key: ArraySpec(trajs.state_shape, trajs.state_dtype),
            **trajs.static_spec,
            **trajs.forcing_spec,
        }

    @property
    def keys(self) -> tuple[str, ...]:
        """The row keys."""
        return tuple(self.element_spec)

    @property
    def gather_block_rows(self) -> int | None:
        """Rows gathered at once when the trajectories are in memory (else None)."""
        return block_rows(self.element_spec) if self.trajectories.in_memory else None

    def fingerprint(self) -> str:
        """SHA-256 of the trajectories' fingerprint."""
        h = Hasher("TrajectoryRows")
        h.update_json(self.trajectories.fingerprint())
        return h.hexdigest()

    def __repr__(self) -> str:
        return f"TrajectoryRows({self.trajectories!r})"
