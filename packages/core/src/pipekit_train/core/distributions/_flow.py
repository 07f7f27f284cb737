"""`Flow`: a predicted conditional normalizing flow (what a `head="flow"` model's output means).

A model trained with `losses.flow_nll(flow_layers=L, flow_bins=K, flow_bound=B,
flow_hidden=H)` outputs, per sample, every parameter of a normalizing flow over the
(normalised) target (layout in `_flow_math`; `H > 0`: coupled
layers whose conditioner weights are part of the output). `Flow` holds that output and evaluates it with the
same array-API functions the loss trains with, in numpy float64: `log_prob` (the change
of variables), `sample` (the inverse pass) and a Monte Carlo `mean`, in the target's
original units (`loc + scale * normalised`, the normalizer's affine map).

**Parameters bounded by a prior box.** The flow's support is unbounded. `within(low,
high)` returns the flow *truncated* to a box, the way `sbi` handles a bounded prior:
`sample` rejects draws outside the box (and redraws), `log_prob` is `-inf` outside and is
renormalised inside by the mass the flow puts in the box (a Monte Carlo estimate from a
fixed seed, `acceptance`). Training is unchanged (no bijection onto the box), so a model
trained without bounds can be truncated by any loader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError, PipekitError

from . import _flow_math as layout

__all__ = ["Flow", "RejectionError", "flow_dim", "flow_from_output"]

#: Draws behind `Flow.mean` (from `np.random.default_rng(0)`).
MEAN_SAMPLES = 10_000
#: Draws behind `Flow.acceptance`, the flow's mass inside the `within` box.
ACCEPTANCE_SAMPLES = 10_000
_MAX_DRAWS_PER_SAMPLE = 10_000  # rejection gives up below an acceptance of 1e-4
_CHUNK = 1 << 21  # parameter values evaluated at once (memory bound of sample/log_prob)


class RejectionError(PipekitError, RuntimeError):
    """`Flow.sample` with a box found too few draws inside it."""


def flow_dim(width: int, flow_layers: int, flow_bins: int, flow_hidden: int = 0) -> int | None:
    """The `d` with `flow_width(d, flow_layers, flow_bins, flow_hidden) == width`, or None
    (`flow_hidden > 0`: `d >= 2`)."""
    for d in range(2 if flow_hidden > 0 else 1, 1 + max(2, width)):
        w = layout.flow_width(d, flow_layers, flow_bins, flow_hidden)
        if w == width:
            return d
        if w > width:
            return None
    return None


def _options(
    flow_layers: Any, flow_bins: Any, flow_bound: Any, flow_hidden: Any = 0
) -> dict[str, Any]:
    """The options as `flow_nll` takes them; `flow_hidden` only when it is not 0 (so an
    element-wise flow's options, and the records holding them, read as before)."""
    options = {"flow_layers": flow_layers, "flow_bins": flow_bins, "flow_bound": flow_bound}
    layout.check_params({**options, "flow_hidden": flow_hidden})
    if flow_hidden != 0:
        options["flow_hidden"] = flow_hidden
    return options


@dataclass(frozen=True, eq=False)
class Flow:
    """Normalizing flows over `d` values, one per sample (leading batch axes `...`).

    `value = loc + scale * u` where `u` follows the flow of `params` (normalised units).

    Attributes:
        params: the raw model output, `(..., flow_width(d, flow_layers, flow_bins,
            flow_hidden))`.
        flow_layers: the number of layers the model was trained with.
        flow_bins: the spline bins per layer and value.
        flow_bound: the spline interval `[-flow_bound, flow_bound]` (normalised units).
        loc: the offset to original units, broadcast against `(..., d)` (default 0).
        scale: the per-value scale to original units, broadcast against `(..., d)`,
            nonzero (default 1).
        low: the lower corner of the box the flow is truncated to (`within`), or None.
        high: the upper corner of that box, or None.
        flow_hidden: the coupling conditioner's hidden units per layer (0: element-wise
            layers, the default).
    """

    params: np.ndarray
    flow_layers: int = 4
    flow_bins: int = 8
    flow_bound: float = 3.0
    loc: Any = 0.0
    scale: Any = 1.0
    low: Any = None
    high: Any = None
    flow_hidden: int = 0
    dim: int = field(init=False)

    def __post_init__(self) -> None:
        _options(self.flow_layers, self.flow_bins, self.flow_bound, self.flow_hidden)
        params = np.asarray(self.params, dtype=np.float64)
        width = int(params.shape[-1]) if params.ndim else 0
        hidden = self.flow_hidden
        d = flow_dim(width, self.flow_layers, self.flow_bins, hidden) if params.ndim else None
        if d is None:
            layers, bins = self.flow_layers, self.flow_bins
            if hidden:
                given = f"flow_layers={layers}, flow_bins={bins} and flow_hidden={hidden}"
                args, sizes = f"{layers}, {bins}, {hidden}", (2, 3, 4)
                check = "`flow_layers`, `flow_bins` and `flow_hidden`"
            else:
                given = f"flow_layers={layers} and flow_bins={bins}"
                args, sizes = f"{layers}, {bins}", (1, 2, 3)
                check = "`flow_layers` and `flow_bins`"
            widths = [layout.flow_width(i, layers, bins, hidden) for i in sizes]
            raise ConfigError(
                f"With `head='flow'`, {given} the model's output width must be "
                f"flow_width(d, {args}) for some d ({widths} for d = "
                f"{', '.join(map(str, sizes))}). Received: output shape {params.shape}. "
                f"Check {check} against the loss the model was trained with."
            )
        object.__setattr__(self, "params", params)
        object.__setattr__(self, "dim", d)
        object.__setattr__(self, "loc", np.asarray(self.loc, dtype=np.float64))
        scale = np.asarray(self.scale, dtype=np.float64)
        if not np.all(np.isfinite(scale)) or np.any(scale == 0):
            raise ConfigError(
                "`scale` must be finite and nonzero (the normalizer's scale of each value). "
                f"Received: scale={scale!r:.80}."
            )
        object.__setattr__(self, "scale", scale)
        if (self.low is None) != (self.high is None):
            raise ConfigError(
                "`low` and `high` go together (the box's corners). Received: "
                f"low={self.low!r:.40}, high={self.high!r:.40}. Use flow.within(low, high)."
            )
        if self.low is not None:
            low = np.broadcast_to(np.asarray(self.low, dtype=np.float64), (d,)).copy()
            high = np.broadcast_to(np.asarray(self.high, dtype=np.float64), (d,)).copy()
            if not np.all(low < high):
                raise ConfigError(
                    f"`low` must be below `high` in every value. Received: low={low.tolist()}, "
                    f"high={high.tolist()}."
                )
            object.__setattr__(self, "low", low)
            object.__setattr__(self, "high", high)

    # ------------------------------------------------------------------ shapes and options

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """The leading axes: one flow per index."""
        return tuple(self.params.shape[:-1])

    @property
    def options(self) -> dict[str, Any]:
        """`{"flow_layers", "flow_bins", "flow_bound"}` (and `"flow_hidden"` when it is not
        0), as `flow_nll` takes them."""
        return _options(self.flow_layers, self.flow_bins, self.flow_bound, self.flow_hidden)

    def _replace(self, **changes: Any) -> Flow:
        fields = {
            "params": self.params,
            **self.options,
            "loc": self.loc,
            "scale": self.scale,
            "low": self.low,
            "high": self.high,
            **changes,
        }
        return Flow(**fields)

    def within(self, low: Any, high: Any) -> Flow:
        """The flow truncated to the box `[low, high]` (original units; see the module doc).

        Args:
            low: the box's lower corner, a number or `d` values.
            high: its upper corner.
        """
        return self._replace(low=low, high=high)

    # ------------------------------------------------------------------ the untruncated flow

    def _chunked(self, fn: Any, values: np.ndarray) -> np.ndarray:
        """`fn(params, values)` over `values` `(*shape, d)` (`shape` broadcast against the
        batch), in chunks: the parameters are gathered per chunk, never broadcast whole.
        Values with axes before the batch's (several per flow) go to `_per_flow`."""
        shape = values.shape[:-1]
        lead = len(shape) - len(self.batch_shape)
        if lead > 0 and shape[lead:] == self.batch_shape:
            return self._per_flow(fn, values, shape[:lead])
        width = self.params.shape[-1]
        table = self.params.reshape(-1, width)
        which = np.arange(len(table)).reshape(self.batch_shape)
        index = np.broadcast_to(which, shape).reshape(-1)
        flat = values.reshape(-1, self.dim)
        step = max(1, _CHUNK // width)
        parts = [
            fn(table[index[i : i + step]], flat[i : i + step], **self.options)
            for i in range(0, max(1, len(flat)), step)
        ]
        return np.concatenate(parts).reshape((*shape, *parts[0].shape[1:]))

    def _per_flow(self, fn: Any, values: np.ndarray, extra: tuple[int, ...]) -> np.ndarray:
        """`_chunked` for `values` `(*extra, *batch, d)`: each flow's parameters once
        (`(rows, 1, width)`) against all its values (`(rows, e, d)`, `fn(...,
        broadcast=True)`), so the spline knots are computed once per flow, not once per
        value. The same numbers as gathering a copy per value, several times faster for
        many values per flow (draws, i.i.d. points)."""
        width = self.params.shape[-1]
        table = self.params.reshape(-1, 1, width)
        flows, count = len(table), int(np.prod(extra, dtype=np.int64))
        per_flow = np.moveaxis(values.reshape(count, flows, self.dim), 0, 1)
        step = max(1, min(count, _CHUNK // width))  # values per flow per call
        rows = max(1, _CHUNK // (width * step))  # flows per call
        blocks = []
        for r in range(0, max(1, flows), rows):
            parts = [
                fn(
                    table[r : r + rows],
                    per_flow[r : r + rows, i : i + step],
                    broadcast=True,
                    **self.options,
                )
                for i in range(0, max(1, count), step)
            ]
            blocks.append(np.concatenate(parts, axis=1))
        out = np.moveaxis(np.concatenate(blocks), 1, 0)
        return out.reshape((*extra, *self.batch_shape, *out.shape[2:]))

    def _raw_log_prob(self, value: np.ndarray) -> np.ndarray:
        u = (value - self.loc) / self.scale
        out = self._chunked(layout.flow_log_prob, u)
        log_scale = np.sum(np.log(np.abs(np.broadcast_to(self.scale, u.shape))), axis=-1)
        return out - log_scale

    def _raw_sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`(n, *batch, d)` draws of the untruncated flow, in original units."""
        z = rng.standard_normal((n, *self.batch_shape, self.dim))
        return self.loc + self.scale * self._chunked(layout.flow_inverse, z)

    def _inside(self, value: np.ndarray) -> np.ndarray:
        assert self.low is not None and self.high is not None
        return np.all((value >= self.low) & (value <= self.high), axis=-1)

    @cached_property
    def acceptance(self) -> np.ndarray:
        """The flow's mass inside the `within` box per flow, shape `batch_shape`.

        A Monte Carlo estimate from `ACCEPTANCE_SAMPLES` (10 000) draws of
        `np.random.default_rng(0)`; all ones without a box.
        """
        if self.low is None:
            return np.ones(self.batch_shape)
        draws = self._raw_sample(np.random.default_rng(0), ACCEPTANCE_SAMPLES)
        return np.mean(self._inside(draws), axis=0)

    # ------------------------------------------------------------------ public distribution

    def log_prob(self, value: Any) -> np.ndarray:
        """The log-density of `value` `(..., d)` (broadcast against the batch), shape `(...)`.

        In original units (the normalised density minus `sum(log|scale|)`). With `value`
        of shape `(n, *batch, d)` each of the `n` draws is scored under the batch's flows
        (e.g. the output of `sample(rng, n)`). Truncated (`within`): `-inf` outside the
        box and `- log(acceptance)` inside.
        """
        y = np.asarray(value, dtype=np.float64)
        if y.ndim < 1 or y.shape[-1] != self.dim:
            raise ConfigError(
                f"`value` must have the flow's {self.dim} values on its last axis. "
                f"Received: value.shape={y.shape}."
            )
        shape = np.broadcast_shapes(y.shape[:-1], self.batch_shape)
        y = np.broadcast_to(y, (*shape, self.dim))
        lp = self._raw_log_prob(y)
        if self.low is None:
            return lp
        with np.errstate(divide="ignore"):
            lp = lp - np.log(self.acceptance)
        return np.where(self._inside(y), lp, -np.inf)

    def sample(self, rng: np.random.Generator, n: int | None = None) -> np.ndarray:
        """Draw from the flows with `rng`: shape `(..., d)`, or `(n, ..., d)`.

        Truncated (`within`): draws outside the box are rejected and redrawn per flow.

        Raises:
            RejectionError: under a box holding less than about 1e-4 of a flow's mass.
        """
        count = 1 if n is None else int(n)
        if isinstance(n, bool) or count < 1:
            raise ConfigError(f"`n` must be a positive int or None. Received: n={n!r}.")
        draws = self._raw_sample(rng, count) if self.low is None else self._rejection(rng, count)
        return draws[0] if n is None else draws

    def _rejection(self, rng: np.random.Generator, n: int) -> np.ndarray:
        flows = int(np.prod(self.batch_shape, dtype=np.int64))
        out = np.empty((n, flows, self.dim))
        filled = np.zeros(flows, dtype=np.int64)
        drawn = 0
        while np.any(filled < n):
            missing = int(np.max(n - filled))
            if drawn > _MAX_DRAWS_PER_SAMPLE * n:
                worst = float(np.min(filled)) / max(1, drawn)
                raise RejectionError(
                    f"`sample` kept {int(np.min(filled))} of {n} draws inside the box "
                    f"[{self.low.tolist()}, {self.high.tolist()}] after {drawn} tries per flow "
                    f"(acceptance about {worst:.1e}): the flow puts almost no mass in the box. "
                    "Check the box against the prior the model was trained on."
                )
            m = max(256, 2 * missing)
            draws = self._raw_sample(rng, m).reshape(m, flows, self.dim)
            drawn += m
            inside = self._inside(draws)
            for j in np.flatnonzero(filled < n):
                kept = draws[inside[:, j], j]
                take = min(len(kept), n - int(filled[j]))
                out[filled[j] : filled[j] + take, j] = kept[:take]
                filled[j] += take
        return out.reshape(n, *self.batch_shape, self.dim)

    @cached_property
    def mean(self) -> np.ndarray:
        """The flows' means, `(..., d)`: a Monte Carlo estimate.

        The average of `MEAN_SAMPLES` (10 000) draws of `np.random.default_rng(0)` (of
        the truncated flow under a box): the same value on every call, with a standard
        error of about `std / 100`. It costs 10 000 inverse passes per flow (measured:
        about 60 ms per flow of 4 layers over 2 values on one CPU core, 32 s for 512).
        """
        return np.mean(self.sample(np.random.default_rng(0), MEAN_SAMPLES), axis=0)

    @classmethod
    def from_output(
        cls,
        out: Any,
        flow_layers: int = 4,
        flow_bins: int = 8,
        flow_bound: float = 3.0,
        flow_hidden: int = 0,
    ) -> Flow:
        """Decode a raw model output `(..., width)` in the `flow_nll` layout (normalised units).

        Raises:
            ConfigError: the width fits no target size for the options.
        """
        return flow_from_output(out, flow_layers, flow_bins, flow_bound, flow_hidden)

    def __getitem__(self, index: Any) -> Flow:
        """The flows at `index` of the batch axes (numpy indexing)."""
        d = self.dim
        loc = np.broadcast_to(self.loc, (*self.batch_shape, d))[index]
        scale = np.broadcast_to(self.scale, (*self.batch_shape, d))[index]
        return self._replace(params=self.params[index], loc=loc, scale=scale)

    def __len__(self) -> int:
        return len(self.params)

    def __repr__(self) -> str:
        box = "" if self.low is None else f", within=[{self.low.tolist()}, {self.high.tolist()}]"
        hidden = f", flow_hidden={self.flow_hidden}" if self.flow_hidden else ""
        return (
            f"Flow(batch_shape={self.batch_shape}, dim={self.dim}, flow_layers={self.flow_layers}, "
            f"flow_bins={self.flow_bins}, flow_bound={self.flow_bound}{hidden}{box})"
        )


def flow_from_output(
    out: Any,
    flow_layers: int = 4,
    flow_bins: int = 8,
    flow_bound: float = 3.0,
    flow_hidden: int = 0,
) -> Flow:
    """Decode a model output `(..., width)` (the `flow_nll` layout) into a `Flow`.

    Raises:
        ConfigError: the width fits no target size for these options.
    """
    return Flow(
        np.asarray(out, dtype=np.float64),
        flow_layers,
        flow_bins,
        flow_bound,
        flow_hidden=flow_hidden,
    )
