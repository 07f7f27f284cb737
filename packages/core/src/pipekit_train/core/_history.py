"""`History`: the metric series of a run, with a PNG plot of the loss curves."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._errors import ConfigError
from ._imports import optional_import

__all__ = ["History"]


class History:
    """Every metric a run wrote, by name, as `(step, value)` series.

    Args:
        records: `(step, {name: value})` pairs in the order they were written.
    """

    def __init__(self, records: Iterable[tuple[int, Mapping[str, float]]] = ()):
        self._series: dict[str, tuple[list[int], list[float]]] = {}
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

    def plot(self, path: str | os.PathLike[str], names: Sequence[str] | None = None) -> str:
        """Draw the loss curves (train and validation) to a PNG and return its path.

        Args:
            path: the PNG file to write.
            names: metrics to draw; default: every metric whose name ends in `loss`.
        """
        chosen = list(names) if names is not None else [n for n in self.names if n.endswith("loss")]
        missing = [n for n in chosen if n not in self._series]
        if missing or not chosen:
            raise ConfigError(
                f"`names` must name recorded metrics. Received: names={chosen!r}; "
                f"the history has {self.names}."
            )
        matplotlib = optional_import("matplotlib", extra="plot", package="pipekit-train-core")
        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
        for name in chosen:
            steps, values = self._series[name]
            ax.plot(steps, values, label=name, marker="o" if len(steps) < 30 else None)
        if all(v > 0 for n in chosen for v in self._series[n][1]):
            ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("value")
        ax.legend()
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.fspath(path))
        plt.close(fig)
        return os.fspath(path)

    def __repr__(self) -> str:
        sizes = {n: len(v[1]) for n, v in self._series.items()}
        return f"History({sizes})"
