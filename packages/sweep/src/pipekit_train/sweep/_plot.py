"""`SweepResult.plot`: the sweep metric against each parameter, one panel per parameter."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

from pipekit_train.core import ConfigError
from pipekit_train.core.adapter import optional_import

if TYPE_CHECKING:
    from ._result import SweepResult

__all__ = ["plot_sweep"]


def _numeric(values: list[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _label(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def plot_sweep(
    result: SweepResult, path: str | os.PathLike[str], params: list[str] | None = None
) -> str:
    """Draw `result`'s metric against each parameter to a PNG (Agg backend); return the path."""
    optional_import("matplotlib", extra="plot", package="pipekit-train-sweep")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    trials = list(result.trials)
    if not trials:
        raise ConfigError(
            "The sweep has no finished trials to plot. Received: 0 trials. Run the sweep first."
        )
    keys: list[str] = []
    for t in trials:
        keys.extend(k for k in t.params if k not in keys)
    if params is None:
        chosen = [k for k in keys if len({repr(t.params.get(k)) for t in trials}) > 1] or keys[:1]
    else:
        unknown = [k for k in params if k not in keys]
        if unknown or not params:
            raise ConfigError(
                f"`params` must name sweep parameters. Received: params={params!r}; known: {keys}."
            )
        chosen = list(params)
    valued = [t for t in trials if t.value is not None and math.isfinite(t.value)]
    best = result.ranked()[0] if result.ranked() else None
    panels = chosen or ["trial"]
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(4.6 * ncols, 3.6 * nrows), dpi=100)
    FigureCanvasAgg(fig)
    values = [t.value for t in valued]
    log_y = bool(values) and min(values) > 0 and max(values) / min(values) > 20  # type: ignore[type-var, operator]
    for i, key in enumerate(panels):
        ax = fig.add_subplot(nrows, ncols, i + 1)

        def x_of(t: Any, key: str = key) -> Any:
            return t.index if key == "trial" else t.params.get(key)

        xs_all = [x_of(t) for t in trials]
        numeric = _numeric([x for x in xs_all if x is not None])
        if numeric:  # trials without this parameter are not drawn in its panel
            trials_here = {id(t) for t in trials if x_of(t) is not None}
        else:
            trials_here = {id(t) for t in trials}
        if numeric:
            positions = {repr(x): x for x in xs_all}
            xs_sorted = sorted({x for x in xs_all if x is not None})
            if xs_sorted and min(xs_sorted) > 0 and max(xs_sorted) / min(xs_sorted) >= 100:
                ax.set_xscale("log")
        else:
            labels = []
            for x in xs_all:
                if _label(x) not in labels:
                    labels.append(_label(x))
            positions = {repr(x): labels.index(_label(x)) for x in xs_all}
            ax.set_xticks(range(len(labels)))
            ax.set_xticklabels(labels, rotation=30 if max(len(s) for s in labels) > 6 else 0)

        def pos(t: Any, positions: dict[str, Any] = positions) -> Any:
            return positions[repr(x_of(t))]

        ok = [t for t in valued if t.status == "ok" and id(t) in trials_here]
        pruned = [t for t in valued if t.status == "pruned" and id(t) in trials_here]
        if numeric and ok:
            envelope: dict[Any, float] = {}
            for t in ok:
                x = pos(t)
                v = float(t.value)  # type: ignore[arg-type]
                if x not in envelope or (
                    v < envelope[x] if result.mode == "min" else v > envelope[x]
                ):
                    envelope[x] = v
            xs = sorted(envelope)
            ax.plot(
                xs, [envelope[x] for x in xs], color="C0", alpha=0.5, lw=1, label=f"best per {key}"
            )
        ax.scatter(
            [pos(t) for t in ok], [t.value for t in ok], color="C0", s=28, label="ok", zorder=3
        )
        if pruned:
            ax.scatter(
                [pos(t) for t in pruned],
                [t.value for t in pruned],
                color="C1",
                marker="v",
                s=30,
                label="pruned (last report)",
                zorder=3,
            )
        if best is not None and id(best) in trials_here:
            ax.scatter(
                [pos(best)],
                [best.value],
                marker="*",
                s=180,
                color="gold",
                edgecolors="black",
                linewidths=0.6,
                label="best",
                zorder=4,
            )
        failed = [t for t in trials if t.status == "failed"]
        if failed:
            for t in failed:
                if x_of(t) is not None:
                    ax.axvline(pos(t), color="C3", alpha=0.35, ls=":", lw=1)
            ax.plot([], [], color="C3", ls=":", label=f"failed ({len(failed)})")
        if log_y:
            ax.set_yscale("log")
        ax.set_xlabel(key)
        ax.set_ylabel(result.metric)
        ax.grid(True, alpha=0.3)
        if i == 0:
            ax.legend(fontsize=7, loc="best")
    arrow = "lower is better" if result.mode == "min" else "higher is better"
    fig.suptitle(
        f"sweep {result.sweep_id}: {result.metric} ({arrow}), {len(trials)} trials", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(os.fspath(path), format="png")
    return os.fspath(path)
