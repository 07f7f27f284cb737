"""`ModelInputs`: what an emulator receives besides its state, in one layout.

A model of trajectories sees more than the current state: the last `history` states,
the **forcings** at the time the step starts from (boundary values, sources, radiation)
and the trajectory's **static** inputs (parameters, coefficient fields, masks). Every
path that calls such a model builds its input the same way, from this one definition:
one-step training and validation (`TrajectoryWindows` deliver it as `"x"`), rollout
training (`rollout_loss` rebuilds it at each unrolled step), `RolloutMonitor`,
`NeuralForward` and `Cycle`.

**The layout: channels concatenated, channels-last.** For a state of shape
`(*spatial, C)` the model input has shape `(*spatial, C_in)`, its last axis holding, in
this order:

1. the states `s[t - (h-1) step], ..., s[t]`, oldest first (`h * C` channels);
2. each forcing at time `t`, in the order of `Trajectories.forcing_keys`;
3. each static input, in the order of `Trajectories.static_keys`.

An extra input of shape `(c,)` (or a scalar, `c = 1`) is broadcast over the grid; one
of shape `(*spatial, c)` is a field on the state's grid. The model predicts the next
state (or its increment) as before: `(*spatial, C)`.

Normalisation is per channel of this input (`TrajectoryWindows.normalizer()` fits it):
the state's statistics repeated for every history slot, then each extra's own. Applying
them to the concatenated input equals normalising each piece by its own statistics, so
the feed normalises `"x"` as one array.

With `history=1` and no extras the input is the state itself: nothing changes for a
model of the state alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError

__all__ = ["ModelInputs"]

Shape = tuple[int, ...]


def _width(kind: str, key: str, shape: Shape, spatial: Shape) -> int:
    """The channels an extra input of one-value `shape` adds (broadcast or on the grid)."""
    if len(shape) == 0:
        return 1
    if len(shape) == 1:
        return int(shape[0])
    if spatial and tuple(shape[:-1]) == tuple(spatial):
        return int(shape[-1])
    grid = f"(*spatial, c) = ({', '.join(map(str, spatial))}, c)" if spatial else "(c,)"
    raise ConfigError(
        f"A {kind} input reaches the model as channels, so one value of it must be a vector "
        f"(c,) (broadcast over the grid) or a field {grid} on the state's grid. Received: "
        f"{kind} {key!r} with shape {tuple(shape)} for states of shape (*spatial, C) = "
        f"({', '.join([*map(str, spatial), 'C'])}). Reshape it channels-last."
    )


@dataclass(frozen=True)
class ModelInputs:
    """The layout of a trajectory model's input (see the module docstring).

    Args:
        state_shape: the shape of one state, channels-last `(*spatial, C)`.
        history: the number of states the model sees (the current one and `history - 1`
            before it), >= 1.
        static: `(key, shape of one trajectory's value)` per static input, in order.
        forcings: `(key, shape of one time step's value)` per forcing, in order.

    Raises:
        ConfigError: `history` below 1, or an extra input that is neither a vector nor
            a field on the state's grid.

    Examples:
        >>> from pipekit_train.core.data import ModelInputs
        >>> inputs = ModelInputs((32, 32, 1), history=2, static=(("nu", (1,)),),
        ...                      forcings=(("source", (32, 32, 1)),))
        >>> inputs.in_channels, inputs.state_channels
        (4, slice(1, 2, None))
    """

    state_shape: Shape
    history: int = 1
    static: tuple[tuple[str, Shape], ...] = ()
    forcings: tuple[tuple[str, Shape], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "state_shape", tuple(int(s) for s in self.state_shape))
        if not self.state_shape:
            raise ConfigError(
                "`state_shape` must have a channel axis. Received: state_shape=(). Add a "
                "trailing channel axis, e.g. (d,) or (H, W, C)."
            )
        h = self.history
        if isinstance(h, bool) or not isinstance(h, (int, np.integer)) or h < 1:
            raise ConfigError(
                f"`history` must be an int >= 1. Received: history={h!r}. Use history=1 for a "
                "model of the current state, history=2 to add the previous one."
            )
        object.__setattr__(self, "history", int(h))
        for name in ("static", "forcings"):
            pairs = tuple(
                (str(k), tuple(int(s) for s in shape)) for k, shape in getattr(self, name)
            )
            object.__setattr__(self, name, pairs)
        spatial = self.state_shape[:-1]
        for key, shape in self.static:
            _width("static", key, shape, spatial)
        for key, shape in self.forcings:
            _width("forcing", key, shape, spatial)

    # -- the layout ----------------------------------------------------------------------
    @property
    def trivial(self) -> bool:
        """Whether the input is the state itself (history 1, no extras)."""
        return self.history == 1 and not self.static and not self.forcings

    @property
    def channels(self) -> int:
        """`C`, the channels of one state."""
        return self.state_shape[-1]

    @property
    def spatial(self) -> Shape:
        """The state's grid `(*spatial)` (empty for vector states)."""
        return self.state_shape[:-1]

    def _widths(self, pairs: Sequence[tuple[str, Shape]], kind: str) -> list[int]:
        return [_width(kind, key, shape, self.spatial) for key, shape in pairs]

    @property
    def forcing_channels(self) -> int:
        """The channels the forcings add."""
        return sum(self._widths(self.forcings, "forcing"))

    @property
    def static_channels(self) -> int:
        """The channels the static inputs add."""
        return sum(self._widths(self.static, "static"))

    @property
    def in_channels(self) -> int:
        """`C_in`, the channels of the model input."""
        return self.history * self.channels + self.forcing_channels + self.static_channels

    @property
    def input_shape(self) -> Shape:
        """The shape of one model input, `(*spatial, C_in)`."""
        return (*self.spatial, self.in_channels)

    @property
    def state_channels(self) -> slice:
        """Where the current state sits on the input's last axis."""
        c = self.channels
        return slice((self.history - 1) * c, self.history * c)

    @property
    def forcing_block(self) -> slice:
        """Where the forcings sit on the input's last axis."""
        start = self.history * self.channels
        return slice(start, start + self.forcing_channels)

    @property
    def static_block(self) -> slice:
        """Where the static inputs sit on the input's last axis."""
        start = self.history * self.channels + self.forcing_channels
        return slice(start, start + self.static_channels)

    # -- building inputs -----------------------------------------------------------------
    def _as_block(
        self, xp: Any, values: Mapping[str, Any], pairs: Sequence[tuple[str, Shape]], lead: Shape
    ) -> list[Any]:
        """Each extra of `values` as `(*lead, *spatial, c)`, in the layout's order."""
        out = []
        for key, shape in pairs:
            if key not in values:
                raise ConfigError(
                    f"The model's input needs {key!r}. Received: inputs with keys "
                    f"{sorted(values)}. Pass every one of {[k for k, _ in pairs]}."
                )
            value = values[key]
            want = tuple(shape) if len(shape) else (1,)
            got = tuple(value.shape[len(lead) :])
            if got != tuple(shape) and got != want:
                raise ConfigError(
                    f"Input {key!r} must have shape {(*lead, *shape)}. Received: "
                    f"{key} with shape {tuple(value.shape)}."
                )
            if len(want) == 1:
                value = xp.reshape(value, (*lead, *(1 for _ in self.spatial), want[0]))
                value = xp.broadcast_to(value, (*lead, *self.spatial, want[0]))
            out.append(value)
        return out

    def forcing_values(self, xp: Any, forcings: Mapping[str, Any], lead: Shape) -> Any:
        """The forcings `{key: (*lead, *shape)}` as one block `(*lead, *spatial, F)`."""
        return xp.concat(self._as_block(xp, forcings, self.forcings, lead), axis=-1)

    def assemble(
        self,
        xp: Any,
        states: Sequence[Any],
        static: Mapping[str, Any] | None = None,
        forcings: Mapping[str, Any] | None = None,
        *,
        forcing_block: Any = None,
    ) -> Any:
        """The model input from its pieces (arrays of one library, one dtype).

        Args:
            xp: the array namespace of the pieces.
            states: the `history` states, oldest first, each `(*lead, *state_shape)`.
            static: `{key: (*lead, *shape)}` for every static key.
            forcings: `{key: (*lead, *shape)}` at the step's start time, for every
                forcing key (or `forcing_block` instead).
            forcing_block: the forcings already as one block `(*lead, *spatial, F)`.

        Returns:
            `(*lead, *spatial, C_in)`.
        """
        if len(states) != self.history:
            raise ConfigError(
                f"The model sees history={self.history} states. Received: {len(states)} "
                f"states. Pass the last {self.history}, oldest first."
            )
        lead = tuple(states[-1].shape[: states[-1].ndim - len(self.state_shape)])
        parts = list(states)
        if self.forcings:
            if forcing_block is None:
                forcing_block = self.forcing_values(xp, forcings or {}, lead)
            parts.append(forcing_block)
        if self.static:
            parts.extend(self._as_block(xp, static or {}, self.static, lead))
        if len(parts) == 1:
            return parts[0]
        return xp.concat(parts, axis=-1)

    def advance(self, xp: Any, inputs: Any, state: Any, forcing_block: Any = None) -> Any:
        """The next step's input: `inputs` with `state` appended to the history (the oldest
        dropped) and the forcings replaced by `forcing_block` (`(*lead, *spatial, F)`)."""
        c = self.channels
        parts = []
        if self.history > 1:
            parts.append(inputs[..., c : self.history * c])
        parts.append(state)
        if self.forcings:
            parts.append(forcing_block)
        if self.static:
            parts.append(inputs[..., self.static_block])
        return parts[0] if len(parts) == 1 else xp.concat(parts, axis=-1)

    def input_stats(
        self,
        state: tuple[np.ndarray, np.ndarray],
        extras: Mapping[str, tuple[np.ndarray, np.ndarray]],
    ) -> tuple[np.ndarray, np.ndarray]:
        """The input's statistics `(mean, std)` from the state's and each extra's.

        Statistics are per channel (shape `(c,)`) or per feature (the piece's one-value
        shape; a vector extra's are broadcast over the grid). Returns arrays of shape
        `(C_in,)` when every piece is per channel, else `(*spatial, C_in)`.
        """
        per_feature = state[0].ndim > 1
        spatial = self.spatial if per_feature else ()

        def block(mean: np.ndarray, shape: Shape) -> np.ndarray:
            m = np.asarray(mean, np.float64)
            if m.ndim <= 1:
                width = m.shape[0] if m.ndim else 1
                m = np.reshape(m, (*(1 for _ in spatial), width))
                return np.broadcast_to(m, (*spatial, width))
            return m  # a per-feature field: already (*spatial, c)

        means, stds = [], []
        for _ in range(self.history):
            means.append(block(state[0], self.state_shape))
            stds.append(block(state[1], self.state_shape))
        for key, shape in (*self.forcings, *self.static):
            if key not in extras:
                raise ConfigError(
                    f"The input's statistics need {key!r}. Received: statistics of "
                    f"{sorted(extras)}. Fit them with TrajectoryWindows.normalizer()."
                )
            m, s = extras[key]
            if not per_feature and np.ndim(m) > 1:  # a field's per-feature stats, pooled
                raise ConfigError(
                    f"Per-channel statistics of {key!r} must be a vector. Received: shape "
                    f"{np.shape(m)}. Fit them per channel."
                )
            means.append(block(m, shape))
            stds.append(block(s, shape))
        return np.concatenate(means, axis=-1), np.concatenate(stds, axis=-1)

    # -- JSON ----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """A JSON object that `from_json` reads back."""
        return {
            "state_shape": list(self.state_shape),
            "history": self.history,
            "static": [[k, list(s)] for k, s in self.static],
            "forcings": [[k, list(s)] for k, s in self.forcings],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelInputs:
        """The layout `to_json` wrote.

        Raises:
            ConfigError: a malformed object.
        """
        try:
            return cls(
                tuple(data["state_shape"]),
                int(data.get("history", 1)),
                tuple((str(k), tuple(s)) for k, s in data.get("static", ())),
                tuple((str(k), tuple(s)) for k, s in data.get("forcings", ())),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"`inputs` must be a ModelInputs JSON object (state_shape, history, static, "
                f"forcings). Received: {dict(data)!r:.200}."
            ) from exc
