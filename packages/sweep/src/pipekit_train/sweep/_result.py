"""`TrialResult` and `SweepResult`: what a sweep hands back."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipekit_train.core import PipekitError

__all__ = ["SweepResult", "TrialFailedError", "TrialResult", "metric_value", "summarize_artifact"]

STATUSES = ("ok", "failed", "pruned")


class TrialFailedError(PipekitError):
    """A trial failed and the sweep was started with `fail_fast=True`.

    Attributes:
        trial: the `TrialResult` of the failed trial (with its error text and traceback).
    """

    def __init__(self, message: str, trial: TrialResult):
        super().__init__(message)
        self.trial = trial


def summarize_artifact(artifact: Any) -> dict[str, Any]:
    """The JSON summary of a `TrainingArtifact` that travels back from a trial's process."""
    checkpoint = (
        (artifact.plan or {}).get("checkpoint") if isinstance(artifact.plan, Mapping) else None
    )
    monitor = (
        checkpoint.get("monitor", "val_loss") if isinstance(checkpoint, Mapping) else "val_loss"
    )
    return {
        "final_metrics": {str(k): float(v) for k, v in artifact.final_metrics.items()},
        "best_metric": None if artifact.best_metric is None else float(artifact.best_metric),
        "best_step": artifact.best_step,
        "monitor": monitor,
        "steps": int(artifact.steps),
        "weights_sha256": artifact.weights_sha256,
        "backend": artifact.backend,
        "wall_time_s": float(artifact.wall_time_s),
        "checkpoint_dir": artifact.checkpoint_dir,
        "stop_reason": artifact.stop_reason,
        "resumed_from_step": artifact.resumed_from_step,
        "sweep_id": artifact.sweep_id,
    }


def metric_value(summary: Mapping[str, Any], metric: str) -> float | None:
    """`final_metrics[metric]`, else `best_metric` when `metric` is the monitored one, else None."""
    final = summary.get("final_metrics") or {}
    if metric in final:
        return float(final[metric])
    if metric == summary.get("monitor", "val_loss") and summary.get("best_metric") is not None:
        return float(summary["best_metric"])
    return None


@dataclass
class TrialResult:
    """One finished trial of a sweep.

    Attributes:
        index: the trial's position in the search space (the Optuna trial number for
            an `OptunaSearch`).
        key: the stable hash of `params` (the journal key; names `trials/<key>`).
        params: the parameter set the trial ran with.
        status: `"ok"`, `"failed"` or `"pruned"`.
        value: the sweep metric (None for failed trials, or when not reported).
        error: `"ExceptionType: message"` for a failed trial.
        summary: the trial's artifact summary (JSON): `final_metrics`, `best_metric`,
            `best_step`, `monitor`, `steps`, `weights_sha256`, `backend`, `wall_time_s`,
            `checkpoint_dir`, `stop_reason`, `resumed_from_step`, `sweep_id`. Empty for a
            trial that failed before training finished.
        wall_time_s: wall time of the whole trial (building the loop + training).
        sweep_id: the sweep this trial belongs to.
        trial_dir: the trial's own folder under the sweep directory.
        traceback: the formatted traceback of a failed trial.
        from_journal: True when this call found the trial finished in the journal and
            did not run it again.
        artifact: the live `TrainingArtifact` (serial executor only, and only for trials
            run by this call; process and Ray trials return summaries).
    """

    index: int
    key: str
    params: dict[str, Any]
    status: str
    value: float | None
    error: str | None
    summary: dict[str, Any]
    wall_time_s: float
    sweep_id: str
    trial_dir: str | None = None
    traceback: str | None = field(default=None, repr=False, compare=False)
    from_journal: bool = field(default=False, compare=False)
    artifact: Any = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """Whether the trial finished with a finite metric value."""
        return self.status == "ok" and self.value is not None and math.isfinite(self.value)

    @property
    def final_metrics(self) -> dict[str, float]:
        """The trial's final metrics (empty for failed trials)."""
        return dict(self.summary.get("final_metrics") or {})

    @property
    def weights_sha256(self) -> str | None:
        """SHA-256 of the trained weights (None for failed trials)."""
        return self.summary.get("weights_sha256")

    def to_json(self) -> dict[str, Any]:
        """The journal record of this trial."""
        return {
            "index": self.index,
            "key": self.key,
            "params": self.params,
            "status": self.status,
            "value": self.value,
            "error": self.error,
            "summary": self.summary,
            "wall_time_s": self.wall_time_s,
            "sweep_id": self.sweep_id,
            "trial_dir": self.trial_dir,
            "traceback": self.traceback,
        }

    @classmethod
    def from_json(cls, record: Mapping[str, Any], *, from_journal: bool = True) -> TrialResult:
        """Rebuild a trial from its journal record."""
        value = record.get("value")
        return cls(
            index=int(record["index"]),
            key=str(record["key"]),
            params=dict(record["params"]),
            status=str(record["status"]),
            value=None if value is None else float(value),
            error=record.get("error"),
            summary=dict(record.get("summary") or {}),
            wall_time_s=float(record.get("wall_time_s", 0.0)),
            sweep_id=str(record.get("sweep_id", "")),
            trial_dir=record.get("trial_dir"),
            traceback=record.get("traceback"),
            from_journal=from_journal,
        )


@dataclass
class SweepResult:
    """The trials of a sweep, ranked by its metric.

    Attributes:
        sweep_id: the id stamped on every trial and every `TrainingArtifact`.
        metric: the metric trials are ranked by.
        mode: `"min"` or `"max"`.
        trials: every finished trial, in search-space order (Optuna trial number order).
        directory: the sweep directory (journal, trial folders).
        wall_time_s: wall time of the `run()` call that produced this result.
        axes: how each parameter is drawn, from the search space: `{name: {"scale":
            "log" | "linear" | "categorical", "discrete": bool, "choices": [...]}}`
            (empty for a plain list of parameter dicts: inferred from the values).
    """

    sweep_id: str
    metric: str
    mode: str
    trials: list[TrialResult]
    directory: str | None = None
    wall_time_s: float = field(default=0.0, compare=False)
    axes: dict[str, dict[str, Any]] = field(default_factory=dict, compare=False)

    def __len__(self) -> int:
        return len(self.trials)

    def __iter__(self) -> Iterator[TrialResult]:
        return iter(self.trials)

    def __getitem__(self, index: int) -> TrialResult:
        return self.trials[index]

    def by_status(self, status: str) -> list[TrialResult]:
        """Trials with `status` (`"ok"`, `"failed"` or `"pruned"`)."""
        if status not in STATUSES:
            raise ValueError(
                f"`status` must be one of {list(STATUSES)}. Received: status={status!r}."
            )
        return [t for t in self.trials if t.status == status]

    def ranked(self) -> list[TrialResult]:
        """Trials with a finite metric, best first (ties keep search-space order)."""
        usable = [t for t in self.trials if t.ok]
        sign = 1.0 if self.mode == "min" else -1.0
        return sorted(usable, key=lambda t: sign * float(t.value))  # type: ignore[arg-type]  # `ok` trials have a value

    @property
    def best(self) -> TrialResult:
        """The best `"ok"` trial by the metric and mode.

        Raises:
            ValueError: no trial finished with a finite metric value.
        """
        ranked = self.ranked()
        if not ranked:
            counts = {s: len(self.by_status(s)) for s in STATUSES}
            raise ValueError(
                f"No trial finished with a finite `{self.metric}` (ok={counts['ok']}, "
                f"failed={counts['failed']}, pruned={counts['pruned']}). See result.to_table() "
                "for the errors."
            )
        return ranked[0]

    def to_json(self) -> dict[str, Any]:
        """JSON form (trials as journal records)."""
        return {
            "sweep_id": self.sweep_id,
            "metric": self.metric,
            "mode": self.mode,
            "directory": self.directory,
            "wall_time_s": self.wall_time_s,
            "axes": self.axes,
            "trials": [t.to_json() for t in self.trials],
        }

    def to_table(self, *, sort: bool = True, max_error_chars: int = 60) -> str:
        """A Markdown table of the trials (also readable as plain text).

        Args:
            sort: best first (failed and pruned trials last); False keeps search-space order.
            max_error_chars: error texts are cut to this length.
        """
        keys: list[str] = []
        for t in self.trials:
            keys.extend(k for k in t.params if k not in keys)
        order = self._sorted() if sort else list(self.trials)
        best = self.ranked()[0] if self.ranked() else None
        header = ["rank", "trial", *keys, self.metric, "status", "steps", "wall s", "note"]
        rows = []
        for rank, t in enumerate(order, start=1):
            note = ""
            if t.status == "failed" and t.error:
                note = (
                    t.error
                    if len(t.error) <= max_error_chars
                    else t.error[: max_error_chars - 1] + "…"
                )
            elif t.status == "pruned":
                note = f"pruned at step {t.summary.get('steps', '?')}"
            elif t is best:
                note = "best"
            rows.append(
                [
                    str(rank) if t.ok else "-",
                    str(t.index),
                    *(_fmt(t.params.get(k, "")) for k in keys),
                    "" if t.value is None else _fmt(t.value),
                    t.status,
                    str(t.summary.get("steps", "")),
                    f"{t.wall_time_s:.2f}",
                    note.replace("|", "\\|").replace("\n", " "),
                ]
            )
        widths = [
            max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
            for i, h in enumerate(header)
        ]
        lines = [
            "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |",
            "|" + "|".join("-" * (w + 2) for w in widths) + "|",
        ]
        lines += [
            "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
            for r in rows
        ]
        return "\n".join(lines)

    def _sorted(self) -> list[TrialResult]:
        ranked = self.ranked()
        ids = {id(t) for t in ranked}
        rest = [t for t in self.trials if id(t) not in ids]
        return (
            ranked
            + [t for t in rest if t.status == "ok"]
            + [t for t in rest if t.status == "pruned"]
            + [t for t in rest if t.status == "failed"]
        )

    def figure(self, params: list[str] | None = None) -> Any:
        """The metric against each parameter as a matplotlib `Figure` (see `plot`)."""
        from ._plot import sweep_figure

        return sweep_figure(self, params)

    def plot(self, path: str | os.PathLike[str], params: list[str] | None = None) -> str:
        """Draw the metric against each parameter (one panel per parameter) to a PNG.

        Each panel follows the search space (`axes`): a log x-axis for a log-scaled
        parameter (`("float", lo, hi, {"log": True})`, or a grid spanning decades), a
        categorical axis for choices, and a "best per value" line only where values repeat
        (grids, choices). With a continuous parameter the figure adds a panel of the metric
        in trial order with the best so far. Failed trials are dotted vertical lines, pruned
        ones orange triangles at their last report, the best trial a star.

        Needs matplotlib (`pip install 'pipekit-train-sweep[plot]'`); drawn with the Agg
        backend, so it works without a display. For an `OptunaSearch`, Optuna's own
        plots work on the study too: `optuna.visualization.matplotlib.plot_slice(search.study)`.

        Args:
            path: the PNG file to write.
            params: the parameters to draw (default: every parameter that varies).

        Returns:
            The path written.
        """
        from ._plot import plot_sweep

        return plot_sweep(self, path, params)

    def __repr__(self) -> str:
        counts = ", ".join(f"{s}={len(self.by_status(s))}" for s in STATUSES)
        best = self.ranked()
        tail = f", best {self.metric}={best[0].value:.4g} at {best[0].params}" if best else ""
        return f"SweepResult(sweep_id={self.sweep_id!r}, {len(self.trials)} trials: {counts}{tail})"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
