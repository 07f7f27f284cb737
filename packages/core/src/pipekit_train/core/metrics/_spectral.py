"""A binned isotropic spectral error for fields on periodic 1-D and 2-D grids (numpy).

The error `pred - target` and the target are Fourier transformed over the grid axes
(`numpy.fft.fftn`, the `spatial_ndim` axes before the channel axis). Each Fourier
mode has the isotropic wavenumber `|k| = sqrt(sum_i k_i**2)`, with
`k_i = 2 pi * fftfreq(N_i)` in radians per grid cell (the Nyquist wavenumber is `pi`).

**Binning.** The default edges follow The Well: `n_bins + 1` edges log-spaced from the
lowest non-zero wavenumber `2 pi / N` (`N` the smallest grid size) to `pi`, with the
first edge moved to 0 (so the mean, `|k| = 0`, is in the first bin) and, unlike The
Well, the last edge moved to infinity (the corner modes of a 2-D grid, `pi < |k| <=
sqrt(2) pi`, belong to the last bin instead of being dropped). Three bins give low,
middle and high wavenumbers. A mode belongs to bin `j` when `edges[j] <= |k| <
edges[j+1]`.

Per bin, per leading index and per channel:

- `relative=False`: the bin's share of the mean squared error,
  `sum_{k in bin} |F(pred - target)(k)|**2 / N_total**2`. By Parseval's theorem the
  bins sum to `mean((pred - target)**2)` over the grid.
- `relative=True` (default): the error's energy in the bin relative to the target's,
  `sqrt(sum_bin |F(pred - target)|**2 / (sum_bin |F(target)|**2 + eps))`: 0 is exact, 1
  is an error as large as the signal at those scales (e.g. predicting zero).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pipekit_train.core._checks import is_int, positive_int
from pipekit_train.core._errors import ConfigError

__all__ = ["spectral_bins", "spectral_error", "wavenumbers"]

_EPS = 1e-7


def wavenumbers(grid_shape: Sequence[int]) -> np.ndarray:
    """The isotropic wavenumber `|k|` (radians per cell) of every Fourier mode of a grid."""
    axes = [2 * np.pi * np.fft.fftfreq(int(n)) for n in grid_shape]
    mesh = np.meshgrid(*axes, indexing="ij")
    return np.sqrt(sum(m * m for m in mesh))


def spectral_bins(grid_shape: Sequence[int], n_bins: int = 3) -> np.ndarray:
    """The default bin edges (see the module doc): `n_bins + 1` values, `0` first, `inf` last.

    Args:
        grid_shape: the grid's sizes (1 or 2 axes).
        n_bins: the number of bins.

    Raises:
        ConfigError: `n_bins` below 1, or a grid side below 2.
    """
    n_bins = positive_int("n_bins", n_bins)
    smallest = min(int(n) for n in grid_shape)
    if smallest < 2:
        raise ConfigError(
            f"A spectral error needs at least 2 points per grid axis. Received: grid shape "
            f"{tuple(grid_shape)}. Pass the grid axes with spatial_ndim."
        )
    edges = np.logspace(np.log10(2 * np.pi / smallest), np.log10(np.pi), n_bins + 1)
    edges[0], edges[-1] = 0.0, np.inf
    return edges


def spectral_error(
    pred: Any,
    target: Any,
    *,
    spatial_ndim: int,
    bins: Sequence[float] | np.ndarray | int | None = None,
    relative: bool = True,
    eps: float = _EPS,
) -> np.ndarray:
    """Binned isotropic spectral error of channels-last fields on a periodic grid.

    Args:
        pred: predictions `(..., *grid, C)` (converted with `np.asarray`).
        target: targets of the same shape.
        spatial_ndim: the number of grid axes, 1 or 2.
        bins: increasing bin edges in radians per cell, an int (that many default bins),
            or None (3 default bins; see the module doc).
        relative: relative error per bin (default) or the bin's share of the MSE.
        eps: added to the target's energy in a bin (`relative=True`).

    Returns:
        float64 array of the leading shape plus `(n_bins, C)`.

    Raises:
        ConfigError: mismatched shapes, `spatial_ndim` not 1 or 2, or bad edges.

    Examples:
        >>> import numpy as np
        >>> from pipekit_train.core.metrics import spectral_error
        >>> target = np.random.default_rng(0).normal(size=(5, 64, 64, 2))
        >>> spectral_error(np.zeros_like(target), target, spatial_ndim=2).round(6)[0, :, 0]
        array([1., 1., 1.])
    """
    p = np.asarray(pred, dtype=np.float64)
    t = np.asarray(target, dtype=np.float64)
    if p.shape != t.shape:
        raise ConfigError(
            "`pred` and `target` must have the same shape for `spectral_error`. "
            f"Received: pred.shape={p.shape}, target.shape={t.shape}."
        )
    if not is_int(spatial_ndim) or spatial_ndim not in (1, 2) or p.ndim < spatial_ndim + 1:
        raise ConfigError(
            "`spatial_ndim` must be 1 or 2 (the periodic grid axes before the channel axis). "
            f"Received: spatial_ndim={spatial_ndim!r} for pred.shape={p.shape}."
        )
    if not isinstance(relative, bool):
        raise ConfigError(f"`relative` must be a bool. Received: relative={relative!r}.")
    grid_axes = tuple(range(p.ndim - 1 - spatial_ndim, p.ndim - 1))
    grid = tuple(p.shape[a] for a in grid_axes)
    if bins is None or is_int(bins):
        edges = spectral_bins(grid, 3 if bins is None else int(bins))  # type: ignore[arg-type]  # an int here
    else:
        edges = np.asarray(bins, dtype=np.float64)
        if edges.ndim != 1 or edges.size < 2 or np.any(np.diff(edges) <= 0):
            raise ConfigError(
                "`bins` must be at least 2 increasing edges. Received: "
                f"bins={np.asarray(bins).tolist()!r}. Use e.g. spectral_bins(grid_shape, 3)."
            )
    k = wavenumbers(grid).ravel()
    which = np.searchsorted(edges, k, side="right") - 1  # bin j: edges[j] <= |k| < edges[j+1]
    n_bins = edges.size - 1
    lead = p.shape[: grid_axes[0]]
    c = p.shape[-1]

    def binned_power(x: np.ndarray) -> np.ndarray:
        f = np.fft.fftn(x, axes=grid_axes)
        power = (f.real**2 + f.imag**2).reshape((*lead, -1, c))
        out = np.zeros((*lead, n_bins, c))
        for j in range(n_bins):
            mask = which == j
            if mask.any():
                out[..., j, :] = power[..., mask, :].sum(axis=-2)
        return out

    error = binned_power(p - t)
    if not relative:
        return error / float(np.prod(grid)) ** 2
    return np.sqrt(error / (binned_power(t) + eps))
