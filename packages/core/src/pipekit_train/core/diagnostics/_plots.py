"""Figures of the diagnostics (matplotlib, the `[plot]` extra), drawn without pyplot.

- `sbc_figure`: per parameter, the ECDF of the fractional SBC ranks minus the uniform CDF,
  with the simultaneous band (grey). Inside the band: calibrated (the SBI diagnostics
  guide, `docs/guides/sbi-diagnostics.md`, shows how to read each shape).
- `coverage_figure`: expected coverage against the credibility level, the diagonal and
  the pointwise 95% interval a calibrated posterior's curve stays in
  (`c ± 1.96 sqrt(c (1 - c) / N)`). Below the diagonal: over-confident.
- `tarp_figure`: TARP's expected coverage probability against `α`, with the diagonal.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from pipekit_train.core._imports import optional_import

if TYPE_CHECKING:
    from ._coverage import CoverageCurve
    from ._sbc import SBCCheck
    from ._tarp import TARPResult

__all__ = ["coverage_figure", "save_png", "sbc_figure", "tarp_figure"]


def _figure(width: float, height: float) -> Any:
    optional_import("matplotlib", extra="plot", package="pipekit-train-core")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def save_png(fig: Any, path: str | os.PathLike[str]) -> str:
    """Write `fig` as a PNG at `path` and return the path."""
    fig.savefig(os.fspath(path), format="png")
    return os.fspath(path)


def sbc_figure(check: SBCCheck, *, title: str | None = None) -> Any:
    """The SBC ECDF-difference plot with its band, one panel per parameter."""
    d = len(check.parameter_names)
    cols = min(d, 4)
    rows = math.ceil(d / cols)
    fig = _figure(3.2 * cols, 2.8 * rows + 0.4)
    for j, name in enumerate(check.parameter_names):
        ax = fig.add_subplot(rows, cols, j + 1)
        ax.fill_between(
            check.points, check.band_lower, check.band_upper, color="0.85",
            label=f"{100 * (1 - check.alpha):.0f}% band",
        )  # fmt: skip
        color = "C0" if check.inside_band[j] else "C3"
        ax.plot(check.points, check.ecdf_difference[:, j], color=color, lw=1.5)
        ax.axhline(0.0, color="0.4", lw=0.6)
        ax.set_title(f"{name}  (χ² p={check.chi2_pvalue[j]:.2g})", fontsize=9)
        ax.set_xlabel("fractional rank")
        if j % cols == 0:
            ax.set_ylabel("ECDF difference")
        if j == 0:
            ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(
        title or f"SBC: {check.ranks.shape[0]} simulations, {check.num_samples} draws each",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def coverage_figure(*curves: CoverageCurve, title: str | None = None) -> Any:
    """Expected coverage curves against the diagonal, with a calibrated curve's 95% range."""
    fig = _figure(4.6, 4.4)
    ax = fig.add_subplot(1, 1, 1)
    levels = np.linspace(0.0, 1.0, 201)
    n = min(c.num_simulations for c in curves)
    half = 1.96 * np.sqrt(levels * (1 - levels) / n)
    ax.fill_between(levels, levels - half, levels + half, color="0.88", label="calibrated, 95%")
    ax.plot([0, 1], [0, 1], color="0.4", lw=0.8, ls="--")
    for k, curve in enumerate(curves):
        lv = curve.levels
        cov = curve.coverage(lv)
        if cov.ndim == 1:
            ax.plot(lv, cov, lw=1.8, color=f"C{k}", label=f"{curve.method} (all parameters)")
        else:
            for j in range(cov.shape[1]):
                label = f"{curve.method} (one line per parameter)" if j == 0 else None
                ax.plot(lv, cov[:, j], lw=1.0, color=f"C{k}", alpha=0.8, label=label)
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="credibility level", ylabel="expected coverage")
    ax.set_aspect("equal")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(title or f"Expected coverage ({n} simulations)", fontsize=10)
    fig.tight_layout()
    return fig


def tarp_figure(result: TARPResult, *, title: str | None = None) -> Any:
    """TARP's expected coverage probability against the credibility level."""
    fig = _figure(4.6, 4.4)
    ax = fig.add_subplot(1, 1, 1)
    ax.plot([0, 1], [0, 1], color="0.4", lw=0.8, ls="--")
    ax.plot(result.alpha, result.ecp, lw=1.8, color="C0", label="TARP")
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="credibility level α", ylabel="expected coverage")
    ax.set_aspect("equal")
    ax.set_title(title or f"TARP: ATC {result.atc:+.3f}, KS p={result.ks_pvalue:.2g}", fontsize=10)
    fig.tight_layout()
    return fig
