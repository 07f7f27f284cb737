"""`SweepResult.plot`: the sweep metric against each parameter, one panel per parameter.

Each panel follows the parameter's axis (`_axes.py`): a log x-axis for a log-scaled
parameter, a categorical axis (tick per choice) for choices, a "best per value" line only
where values repeat (grids, stepped ranges, choices). A continuous parameter gets a plain
scatter, and the figure gets one more panel: the metric in trial order with the best so
far, which shows whether an adaptive search converged.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

from pipekit_train.core import ConfigError
from pipekit_train.core.utils import optional_import

from ._axes import axis_from_values, is_number, value_key

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ._result import SweepResult, TrialResult

__all__ = ["plot_sweep", "sweep_figure"]

_HISTORY = "trial"
_MAX_TICKS = 10


def _label(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return value if isinstance(value, str) else value_key(value)


def _better(a: float, b: float, mode: str) -> bool:
    return a < b if mode == "min" else a > b


def _choose(result: SweepResult, params: list[str] | None) -> list[str]:
    keys: list[str] = []
    for t in result.trials:
        keys.extend(k for k in t.params if k not in keys)
    if params is None:
        varying = [k for k in keys if len({value_key(t.params.get(k)) for t in result.trials}) > 1]
        return varying or keys[:1]
    unknown = [k for k in params if k not in keys]
    if unknown or not params:
        raise ConfigError(
            f"`params` must name sweep parameters. Received: params={params!r}; known: {keys}."
        )
    return list(params)


def _axis(result: SweepResult, key: str) -> dict[str, Any]:
    values = [t.params[key] for t in result.trials if key in t.params]
    axis = dict((result.axes or {}).get(key) or axis_from_values(values))
    if axis["scale"] != "categorical" and not all(is_number(v) for v in values):
        axis = axis_from_values(values)  # a declared numeric axis, but other values ran
    if axis["scale"] == "log" and any(float(v) <= 0 for v in values):
        axis["scale"] = "linear"
    if axis["scale"] == "categorical":
        choices = {value_key(c): c for c in axis.get("choices", [])}
        for v in values:
            choices.setdefault(value_key(v), v)
        axis["choices"] = list(choices.values())
    return axis


def _positions(trials: list[TrialResult], key: str, axis: dict[str, Any]) -> dict[int, float]:
    """x position of each trial (by id) in this panel; categorical: index + a small spread."""
    if axis["scale"] != "categorical":
        return {id(t): float(t.params[key]) for t in trials}
    slot = {value_key(c): i for i, c in enumerate(axis["choices"])}
    groups: dict[int, list[TrialResult]] = {}
    for t in trials:
        groups.setdefault(slot[value_key(t.params[key])], []).append(t)
    out = {}
    for i, group in groups.items():
        n = len(group)
        for j, t in enumerate(group):
            out[id(t)] = i + (0.0 if n == 1 else 0.3 * (j / (n - 1) - 0.5))
    return out


def _values(trials: list[TrialResult]) -> list[float]:
    """The metric values of trials that have one (every `ok` trial, pruned ones with a value)."""
    return [t.value for t in trials if t.value is not None]


def _best_per_value(trials: list[TrialResult], key: str, mode: str) -> dict[str, tuple[Any, float]]:
    best: dict[str, tuple[Any, float]] = {}
    for t in trials:
        k = value_key(t.params[key])
        v = float(t.value)  # type: ignore[arg-type]  # `ok` trials (the only ones passed) have a value
        if k not in best or _better(v, best[k][1], mode):
            best[k] = (t.params[key], v)
    return best


def _param_panel(ax: Axes, result: SweepResult, key: str, best: TrialResult | None) -> bool:
    """Draw one parameter's panel; return whether it shows any metric value."""
    axis = _axis(result, key)
    here = [t for t in result.trials if key in t.params]
    pos = _positions(here, key, axis)
    finite = [t for t in here if t.value is not None and math.isfinite(t.value)]
    ok = [t for t in finite if t.status == "ok"]
    pruned = [t for t in finite if t.status == "pruned"]
    failed = [t for t in here if t.status == "failed"]
    categorical = axis["scale"] == "categorical"
    if axis["discrete"] and ok:
        per_value = _best_per_value(ok, key, result.mode)
        if categorical:
            slot = {value_key(c): i for i, c in enumerate(axis["choices"])}
            at = [slot[k] for k in per_value]
            ax.hlines(  # one short bar per choice: no line joins unrelated choices
                [v for _, v in per_value.values()],
                [x - 0.3 for x in at],
                [x + 0.3 for x in at],
                color="C0",
                alpha=0.6,
                lw=1.5,
                label="best per choice",
            )
        else:
            xs = sorted((float(x), v) for x, v in per_value.values())
            ax.plot(
                [x for x, _ in xs],
                [v for _, v in xs],
                color="C0",
                alpha=0.5,
                lw=1,
                label="best per value",
            )
    ax.scatter([pos[id(t)] for t in ok], _values(ok), color="C0", s=26, label="ok", zorder=3)
    if pruned:
        ax.scatter(
            [pos[id(t)] for t in pruned],
            _values(pruned),
            color="C1",
            marker="v",
            s=30,
            label="pruned (last report)",
            zorder=3,
        )
    if best is not None and id(best) in pos:
        ax.scatter(
            [pos[id(best)]],
            _values([best]),
            marker="*",
            s=180,
            color="gold",
            edgecolors="black",
            linewidths=0.6,
            label="best",
            zorder=4,
        )
    for t in failed:
        ax.axvline(pos[id(t)], color="C3", alpha=0.35, ls=":", lw=1)
    if failed:
        ax.plot([], [], color="C3", ls=":", label=f"failed ({len(failed)})")
    if categorical:
        labels = [_label(c) for c in axis["choices"]]
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=30 if max(len(s) for s in labels) > 6 else 0)
        ax.set_xlim(-0.5, len(labels) - 0.5)
        ax.set_xlabel(key)
    else:
        ax.set_xscale(axis["scale"])
        ax.set_xlabel(f"{key} (log scale)" if axis["scale"] == "log" else key)
        ticks = sorted({float(t.params[key]) for t in here})
        if axis["discrete"] and len(ticks) <= _MAX_TICKS:  # grid values: a tick at each
            ax.set_xticks(ticks, [_label(v) for v in ticks])
            ax.minorticks_off()
    return bool(ok or pruned)


def _history_panel(ax: Axes, result: SweepResult) -> bool:
    """The metric in trial order, with the best value so far."""
    trials = sorted(result.trials, key=lambda t: t.index)
    ok = [t for t in trials if t.ok]
    pruned = [
        t for t in trials if t.status == "pruned" and t.value is not None and math.isfinite(t.value)
    ]
    ax.scatter([t.index for t in ok], _values(ok), color="C0", s=20, label="ok", zorder=3)
    if pruned:
        ax.scatter(
            [t.index for t in pruned],
            _values(pruned),
            color="C1",
            marker="v",
            s=24,
            label="pruned",
            zorder=3,
        )
    xs: list[int] = []
    ys: list[float] = []
    for t in ok:
        v = float(t.value)  # type: ignore[arg-type]  # an `ok` trial has a value
        ys.append(v if not ys or _better(v, ys[-1], result.mode) else ys[-1])
        xs.append(t.index)
    if xs:
        ax.step(xs, ys, where="post", color="C2", lw=1.5, label="best so far")
    ax.set_xlabel("trial number")
    ax.legend(fontsize=7, loc="best")
    return bool(ok or pruned)


def sweep_figure(result: SweepResult, params: list[str] | None = None) -> Figure:
    """`result`'s metric against each parameter as a matplotlib `Figure` (Agg canvas)."""
    optional_import("matplotlib", extra="plot", package="pipekit-train-sweep")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not result.trials:
        raise ConfigError(
            "The sweep has no finished trials to plot. Received: 0 trials. Run the sweep first."
        )
    chosen = _choose(result, params)
    axes_of = {k: _axis(result, k) for k in chosen}
    history = not chosen or any(not a["discrete"] for a in axes_of.values())
    panels = [*chosen, _HISTORY] if history else chosen
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(4.6 * ncols, 3.8 * nrows), dpi=100)
    FigureCanvasAgg(fig)
    ranked = result.ranked()
    best = ranked[0] if ranked else None
    values = [
        float(t.value) for t in result.trials if t.value is not None and math.isfinite(t.value)
    ]
    log_y = bool(values) and min(values) > 0 and max(values) / min(values) > 20
    first: Axes | None = None
    for i, key in enumerate(panels):
        # one metric on every panel: a shared y-axis makes the panels comparable
        ax = fig.add_subplot(nrows, ncols, i + 1, sharey=first)
        first = first or ax
        if key == _HISTORY:
            drawn = _history_panel(ax, result)
        else:
            drawn = _param_panel(ax, result, key, best)
            if i == 0:
                ax.legend(fontsize=7, loc="best")
        if log_y and drawn:
            ax.set_yscale("log")
        ax.set_ylabel(result.metric)
        ax.grid(True, alpha=0.3)
    arrow = "lower is better" if result.mode == "min" else "higher is better"
    counts = ", ".join(
        f"{len(result.by_status(s))} {s}" for s in ("ok", "pruned", "failed") if result.by_status(s)
    )
    fig.suptitle(f"sweep {result.sweep_id}: {result.metric} ({arrow}); {counts}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_sweep(
    result: SweepResult, path: str | os.PathLike[str], params: list[str] | None = None
) -> str:
    """Draw `result`'s metric against each parameter to a PNG (Agg backend); return the path."""
    sweep_figure(result, params).savefig(os.fspath(path), format="png")
    return os.fspath(path)
