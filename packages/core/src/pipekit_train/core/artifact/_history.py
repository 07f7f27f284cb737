"""`History`: the metric series of a run, with a PNG plot of the loss curves."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pipekit_train.core._errors import ConfigError
from pipekit_train.core._imports import optional_import

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["History"]

_CURVE_LABELS = {"loss": "train", "val_loss": "validation"}
_LOSS_NAMES = {
    "mse": "MSE",
    "mae": "MAE",
    "huber": "Huber",
    "gaussian_nll": "Gaussian NLL",
    "mixture_nll": "mixture NLL",
    "cross_entropy": "cross-entropy",
    "binary_cross_entropy": "binary cross-entropy",
}


def _weight(w: Any) -> str:
    return "" if float(w) == 1.0 else f"{float(w):g}·"


def loss_label(description: Any) -> str:
    """A short display name of a loss from its JSON description (`Loss.describe()`).

    `{"name": "mse"}` → `"MSE"`; `{"name": "huber", "params": {"delta": 0.5}}` →
    `"Huber (delta=0.5)"`; a weighted sum → `"MSE + 0.1·MAE"`; a per-key loss →
    `"a: MSE + b: MAE"`; an import path `"pkg.mod:my_loss"` → `"my_loss"`.
    """
    if isinstance(description, str):
        return description.rpartition(":")[2] or description
    if not isinstance(description, Mapping):
        return str(description)
    if "weighted" in description:
        return " + ".join(
            _weight(t["weight"]) + loss_label(t["loss"]) for t in description["weighted"]
        )
    if "per_key" in description:
        return " + ".join(
            f"{key}: {_weight(t['weight'])}{loss_label(t['loss'])}"
            for key, t in description["per_key"].items()
        )
    if "name" in description:
        label = _LOSS_NAMES.get(str(description["name"]), str(description["name"]))
    elif "import_path" in description:
        label = str(description["import_path"]).rpartition(":")[2]
    else:
        label = "custom loss"
    params = description.get("params") or {}
    if params:
        label += " (" + ", ".join(f"{k}={v!r}" for k, v in params.items()) + ")"
    return label


class History:
    """Every metric a run wrote, by name, as `(step, value)` series.

    Args:
        records: `(step, {name: value})` pairs in the order they were written.

    Attributes:
        backend: the backend that trained (set by the training runtime), or None.
        loss: the loss's display name (e.g. `"MSE"`), or None.
        normalized: whether the loss was computed on normalised data.
        run: a short name of the run (checkpoint directory or model factory), or None.
    """

    def __init__(self, records: Iterable[tuple[int, Mapping[str, float]]] = ()):
        self._series: dict[str, tuple[list[int], list[float]]] = {}
        self.backend: str | None = None
        self.loss: str | None = None
        self.normalized = False
        self.run: str | None = None
        for step, metrics in records:
            self.add(step, metrics)

    def add(self, step: int, metrics: Mapping[str, float]) -> None:
        """Append one step's metrics."""
        for name, value in metrics.items():
            steps, values = self._series.setdefault(name, ([], []))
            steps.append(int(step))
            values.append(float(value))

    @property
    def names(self) -> list[str]:
        """Metric names, sorted."""
        return sorted(self._series)

    def series(self, name: str) -> tuple[list[int], list[float]]:
        """`(steps, values)` of one metric."""
        if name not in self._series:
            raise KeyError(f"No metric {name!r} in the history. Known: {self.names}.")
        steps, values = self._series[name]
        return list(steps), list(values)

    def __getitem__(self, name: str) -> list[float]:
        return self.series(name)[1]

    def __contains__(self, name: object) -> bool:
        return name in self._series

    def last(self, name: str) -> float | None:
        """The last value of a metric, or None."""
        if name not in self._series or not self._series[name][1]:
            return None
        return self._series[name][1][-1]

    def to_json(self) -> dict[str, Any]:
        """`{name: {"steps": [...], "values": [...]}}` (non-finite values as strings)."""
        return {
            name: {"steps": list(s), "values": [v if math.isfinite(v) else repr(v) for v in vals]}
            for name, (s, vals) in self._series.items()
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> History:
        """Inverse of `to_json`."""
        history = cls()
        for name, entry in data.items():
            history._series[name] = (
                [int(s) for s in entry["steps"]],
                [float(v) for v in entry["values"]],
            )
        return history

    # -- run context (set by the training runtime; used for plot labels) ------------------
    def annotate(
        self,
        *,
        backend: str | None = None,
        loss: str | None = None,
        normalized: bool | None = None,
        run: str | None = None,
    ) -> None:
        """Record what the series mean, for plot labels (the training runtime calls this).

        Args:
            backend: the backend that trained (`"equinox"`, `"lightning"`, ...).
            loss: the loss's display name (e.g. `"MSE"`; see `loss_label`).
            normalized: whether the loss was computed on normalised data
                (`TrainingLoop(normalizer=...)`).
            run: a short name of the run (e.g. its checkpoint directory or model factory).
        """
        if backend is not None:
            self.backend = backend
        if loss is not None:
            self.loss = loss
        if normalized is not None:
            self.normalized = bool(normalized)
        if run is not None:
            self.run = run

    def figure(self, names: Sequence[str] | None = None, *, title: str | None = None) -> Figure:
        """The loss curves as a matplotlib `Figure` (not drawn to screen; no pyplot state).

        The y-axis names the loss and its units (`"MSE (normalised units)"` when the run
        used a normalizer), the title names the loss, backend and run, the legend names the
        train and validation curves, and the y-axis is logarithmic when every value is
        positive and they span more than a decade. The best validation value is marked.

        Args:
            names: metrics to draw; default: every metric whose name ends in `loss`.
            title: the figure title (default: built from the run context).

        Raises:
            ConfigError: `names` names no recorded metric.
        """
        chosen = list(names) if names is not None else [n for n in self.names if n.endswith("loss")]
        missing = [n for n in chosen if n not in self._series]
        if missing or not chosen:
            raise ConfigError(
                f"`names` must name recorded metrics. Received: names={chosen!r}; "
                f"the history has {self.names}."
            )
        optional_import("matplotlib", extra="plot", package="pipekit-train-core")
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(7, 4.2), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        for name in chosen:
            steps, values = self._series[name]
            style = "--" if name.startswith("val_") and len(steps) >= 30 else "-"
            ax.plot(
                steps,
                values,
                ls=style,
                label=_CURVE_LABELS.get(name, name),
                marker="o" if len(steps) < 30 else None,
                ms=4,
            )
        best = self._best_validation(chosen)
        if best is not None:
            step, value = best
            ax.scatter(
                [step],
                [value],
                marker="*",
                s=140,
                color="gold",
                edgecolors="black",
                linewidths=0.6,
                zorder=4,
                label=f"best validation {value:.3g} (step {step})",
            )
        finite = [v for n in chosen for v in self._series[n][1] if math.isfinite(v)]
        if finite and min(finite) > 0 and max(finite) / min(finite) > 10:
            ax.set_yscale("log")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(self._ylabel(chosen))
        ax.set_title(title if title is not None else self._title(), fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
        ax.grid(True, which="minor", alpha=0.1)
        fig.tight_layout()
        return fig

    def plot(
        self,
        path: str | os.PathLike[str],
        names: Sequence[str] | None = None,
        *,
        title: str | None = None,
    ) -> str:
        """Draw the loss curves (train and validation) to a PNG and return its path.

        Args:
            path: the PNG file to write.
            names: metrics to draw; default: every metric whose name ends in `loss`.
            title: the figure title (default: the loss, backend and run).
        """
        fig = self.figure(names, title=title)
        fig.savefig(os.fspath(path), format="png")
        return os.fspath(path)

    def _best_validation(self, chosen: Sequence[str]) -> tuple[int, float] | None:
        if "val_loss" not in chosen:
            return None
        pairs = [(s, v) for s, v in zip(*self._series["val_loss"], strict=True) if math.isfinite(v)]
        if len(pairs) < 2:
            return None
        return min(pairs, key=lambda p: p[1])

    def _ylabel(self, chosen: Sequence[str]) -> str:
        losses_only = all(n.endswith("loss") for n in chosen)
        base = (self.loss or "loss") if losses_only else "value"
        return f"{base} (normalised units)" if self.normalized else base

    def _title(self) -> str:
        head = f"{self.loss} loss" if self.loss else "loss"
        if self.backend:
            head += f", {self.backend} backend"
        return f"{head}\nrun: {self.run}" if self.run else head

    def __repr__(self) -> str:
        sizes = {n: len(v[1]) for n, v in self._series.items()}
        return f"History({sizes})"
