"""The three sources of `Trajectories`: in-memory arrays, a dataset of whole trajectories,
and a dataset of one state per row (trajectory-major).

Each source has `n` trajectories of `length` states and answers
`gather(traj, times) -> (states (B, L, ...), static {key: (B, ...)}, forcings {key: (B, L, ...)})`
for source trajectory indices `traj (B,)` and time indices `times (B, L)`, plus `spec()`,
`chunk_states()` (its out-of-core chunk layout in states, or None) and `fingerprint(h)`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.data.datasets._dataset import ArraySpec, Batch, check_key, gather_batch
from pipekit_train.core.data.datasets._hashing import Hasher

__all__ = ["ArraySource", "DatasetSource", "RowSource", "check_keys"]


def _spec_of(dataset: Any) -> dict[str, ArraySpec]:
    spec = getattr(dataset, "element_spec", None)
    if spec is not None:
        return dict(spec)
    return {k: ArraySpec(np.shape(v), np.asarray(v).dtype) for k, v in dataset[0].items()}


def _chunk_layout(dataset: Any) -> tuple[int, int] | None:
    """`(chunk_size, shuffle_window)` when `dataset` declares a chunk-aware shuffle."""
    chunk, window = getattr(dataset, "chunk_size", None), getattr(dataset, "shuffle_window", None)
    if isinstance(chunk, int) and isinstance(window, int) and chunk > 0 and window > 0:
        return chunk, window
    return None


def _fingerprint_of(dataset: Any) -> str:
    fingerprint = getattr(dataset, "fingerprint", None)
    return str(fingerprint()) if callable(fingerprint) else type(dataset).__name__


def check_keys(state_key: str, static: Sequence[str], forcings: Sequence[str]) -> None:
    """Validate the keys of a trajectory: valid sample keys, all distinct."""
    check_key(state_key, field="state_key")
    seen = {state_key}
    for key in (*static, *forcings):
        check_key(key, field="static/forcings")
        if key in seen:
            raise ConfigError(
                f"Every key of a trajectory must be distinct. Received: key {key!r} twice among "
                f"state_key={state_key!r}, static={list(static)}, forcings={list(forcings)}. "
                "Rename one of them."
            )
        seen.add(key)


class ArraySource:
    """Trajectories held in memory: `states (n, T, ...)`, `static (n, ...)`, `forcings (n, T, ...)`."""

    def __init__(
        self,
        states: np.ndarray,
        static: Mapping[str, np.ndarray],
        forcings: Mapping[str, np.ndarray],
    ) -> None:
        self.states, self.static, self.forcings = states, dict(static), dict(forcings)
        self.n, self.length = int(states.shape[0]), int(states.shape[1])

    def spec(self) -> tuple[ArraySpec, dict[str, ArraySpec], dict[str, ArraySpec]]:
        return (
            ArraySpec(self.states.shape[2:], self.states.dtype),
            {k: ArraySpec(a.shape[1:], a.dtype) for k, a in self.static.items()},
            {k: ArraySpec(a.shape[2:], a.dtype) for k, a in self.forcings.items()},
        )

    def gather(self, traj: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, Batch, Batch]:
        rows = traj[:, None]
        return (
            self.states[rows, times],
            {k: a[traj] for k, a in self.static.items()},
            {k: a[rows, times] for k, a in self.forcings.items()},
        )

    def chunk_states(self) -> tuple[int, int] | None:
        return None

    def fingerprint(self, h: Hasher) -> None:
        h.update_json("arrays")
        h.update_array(self.states)
        for group in (self.static, self.forcings):
            h.update_json(sorted(group))
            for key in sorted(group):
                h.update_array(group[key])


class DatasetSource:
    """Trajectories as the items of an indexable dataset (one item per trajectory)."""

    def __init__(
        self, dataset: Any, state_key: str, static: tuple[str, ...], forcings: tuple[str, ...]
    ) -> None:
        self.dataset, self.state_key = dataset, state_key
        self.static_keys, self.forcing_keys = static, forcings
        self.item_spec = _spec_of(dataset)
        for field, keys in (
            ("state_key", (state_key,)),
            ("static", static),
            ("forcings", forcings),
        ):
            for key in keys:
                if key not in self.item_spec:
                    raise ConfigError(
                        f"`{field}` names {key!r}, which the dataset's items do not have. "
                        f"Received: {field}={key!r}; the items have keys {sorted(self.item_spec)}."
                    )
        state = self.item_spec[state_key]
        if len(state.shape) < 2:
            raise ConfigError(
                f"The dataset's item {state_key!r} must be a trajectory (T, *state_shape). "
                f"Received: {state_key} with shape {state.shape}. Return the whole trajectory "
                "from the simulator, or use Trajectories.from_rows for one state per item."
            )
        self.n, self.length = len(dataset), int(state.shape[0])
        for key in forcings:
            shape = self.item_spec[key].shape
            if len(shape) < 1 or shape[0] != self.length:
                raise ConfigError(
                    f"A forcing must have one value per time step. Received: {key} with shape "
                    f"{shape}, but the trajectories have T={self.length} states. Pass it as "
                    "`static` if it does not change in time."
                )

    def spec(self) -> tuple[ArraySpec, dict[str, ArraySpec], dict[str, ArraySpec]]:
        s = self.item_spec
        return (
            ArraySpec(s[self.state_key].shape[1:], s[self.state_key].dtype),
            {k: s[k] for k in self.static_keys},
            {k: ArraySpec(s[k].shape[1:], s[k].dtype) for k in self.forcing_keys},
        )

    def gather(self, traj: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, Batch, Batch]:
        unique, inverse = np.unique(traj, return_inverse=True)
        items = gather_batch(self.dataset, unique)
        rows = inverse[:, None]
        return (
            np.asarray(items[self.state_key])[rows, times],
            {k: np.asarray(items[k])[inverse] for k in self.static_keys},
            {k: np.asarray(items[k])[rows, times] for k in self.forcing_keys},
        )

    def chunk_states(self) -> tuple[int, int] | None:
        layout = _chunk_layout(self.dataset)
        return None if layout is None else (layout[0] * self.length, layout[1])

    def fingerprint(self, h: Hasher) -> None:
        h.update_json(
            {
                "dataset": _fingerprint_of(self.dataset),
                "state_key": self.state_key,
                "static": list(self.static_keys),
                "forcings": list(self.forcing_keys),
            }
        )


class RowSource:
    """Trajectories stored one state per row, trajectory-major: row `i * T + t`."""

    def __init__(
        self,
        dataset: Any,
        length: int,
        state_key: str,
        static: tuple[str, ...],
        forcings: tuple[str, ...],
    ) -> None:
        self.dataset, self.state_key, self.length = dataset, state_key, length
        self.static_keys, self.forcing_keys = static, forcings
        self.row_spec = _spec_of(dataset)
        for field, keys in (
            ("state_key", (state_key,)),
            ("static", static),
            ("forcings", forcings),
        ):
            for key in keys:
                if key not in self.row_spec:
                    raise ConfigError(
                        f"`{field}` names {key!r}, which the dataset's rows do not have. "
                        f"Received: {field}={key!r}; the rows have keys {sorted(self.row_spec)}."
                    )
        rows = len(dataset)
        if rows % length:
            raise ConfigError(
                f"The rows must hold whole trajectories of `length` states. Received: "
                f"length={length}, but the dataset has {rows} rows ({rows} % {length} = "
                f"{rows % length}). Pass the trajectories' number of states as `length`."
            )
        self.n = rows // length

    def spec(self) -> tuple[ArraySpec, dict[str, ArraySpec], dict[str, ArraySpec]]:
        s = self.row_spec
        return (
            s[self.state_key],
            {k: s[k] for k in self.static_keys},
            {k: s[k] for k in self.forcing_keys},
        )

    def gather(self, traj: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, Batch, Batch]:
        rows = (traj[:, None] * self.length + times).ravel()
        batch = gather_batch(self.dataset, rows)
        shape = times.shape

        def unflat(a: Any) -> np.ndarray:
            a = np.asarray(a)
            return a.reshape(shape + a.shape[1:])

        return (
            unflat(batch[self.state_key]),
            {k: unflat(batch[k])[:, 0] for k in self.static_keys},
            {k: unflat(batch[k]) for k in self.forcing_keys},
        )

    def chunk_states(self) -> tuple[int, int] | None:
        return _chunk_layout(self.dataset)

    def fingerprint(self, h: Hasher) -> None:
        h.update_json(
            {
                "rows": _fingerprint_of(self.dataset),
                "length": self.length,
                "state_key": self.state_key,
                "static": list(self.static_keys),
                "forcings": list(self.forcing_keys),
            }
        )
