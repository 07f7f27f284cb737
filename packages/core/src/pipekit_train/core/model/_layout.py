"""The `layout` option every backend's model operator takes, defined once.

pipekit-train's datasets hold fields channels-last: a sample of a field on a `d`-D grid
is `(*spatial, C)`, a batch `(N, *spatial, C)`. Torch's, Equinox's (`eqx.nn.Conv`) and
most of the field's networks (APEBench/pdequinox, The Well, PDEBench) read one
channels-first sample `(C, *spatial)`, a batch `(N, C, *spatial)`.

A model operator's `layout` names the layout of the arrays the operator takes and
returns, for a channels-first network:

- `"channels_last"`: the operator takes and returns channels-last fields and hands its
  network channels-first ones. Before the network a batch of rank >= 3 has its last axis
  moved to position 1 (`(N, *spatial, C) -> (N, C, *spatial)`: per sample
  `(*spatial, C) -> (C, *spatial)`), and after it an output of rank >= 3 has axis 1 moved
  back to the end. Batches of rank <= 2 (vectors) pass unchanged.
- `"channels_first"`: the network's own layout; inputs pass unchanged.

The permutation is the operator's, at the network's boundary, on every path (training,
evaluation, prediction, device rollout): the data stays channels-last, and the weights
are the network's own.
"""

from __future__ import annotations

from typing import Any

from pipekit_train.core._errors import ConfigError

__all__ = ["LAYOUTS", "check_layout", "to_channels_first_axes", "to_channels_last_axes"]

LAYOUTS = ("channels_first", "channels_last")
"""The values of a model operator's `layout` (see the module docstring)."""


def check_layout(layout: Any, *, owner: str = "The model operator") -> str:
    """`layout` if it is one of `LAYOUTS`, else a `ConfigError` naming the choices.

    Args:
        layout: the value to check.
        owner: the operator named in the error.

    Raises:
        ConfigError: `layout` is not one of `LAYOUTS`.
    """
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ConfigError(
            f"{owner}'s `layout` must be one of {list(LAYOUTS)}. Received: layout={layout!r}. "
            "Use layout='channels_last' for pipekit-train's channels-last fields "
            "(N, *spatial, C) on a channels-first network (it permutes at the network's "
            "boundary)."
        )
    return layout


def to_channels_first_axes(ndim: int) -> tuple[int, ...] | None:
    """The axis order taking a channels-last batch of rank `ndim` to channels-first.

    `(0, ndim - 1, 1, ..., ndim - 2)` for `ndim >= 3` (`(N, *spatial, C) -> (N, C, *spatial)`),
    None for a rank below 3 (nothing to move).
    """
    if ndim < 3:
        return None
    return (0, ndim - 1, *range(1, ndim - 1))


def to_channels_last_axes(ndim: int) -> tuple[int, ...] | None:
    """The inverse of `to_channels_first_axes`: `(0, 2, ..., ndim - 1, 1)`, None below rank 3."""
    if ndim < 3:
        return None
    return (0, *range(2, ndim), 1)
