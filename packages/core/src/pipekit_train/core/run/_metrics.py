"""Metric routing of a run: steps recorded with device values, fetched in groups.

Device values are fetched to the host only when a callback reads them or a group of
`log_every_n_steps` steps is flushed; then the rows go to the history and the writers,
and the non-finite policy is applied, in step order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from pipekit_train.core.artifact._history import History
from pipekit_train.core.metrics._grad_norm import reduce_micro

if TYPE_CHECKING:
    from pipekit_train.core.spec._plan import Plan

    from ._dispatch import Callbacks
    from ._progress import Progress

__all__ = ["SKIPPED_METRIC", "MetricLog", "default_fetch"]

SKIPPED_METRIC = "nonfinite_skipped"
"""Under `on_nonfinite="skip"`: written on each skipped step, the run's skips so far."""


def default_fetch(values: Sequence[Any]) -> list[np.ndarray]:
    """Bring device values to the host as numpy arrays (one call per group)."""
    return [np.asarray(v) for v in values]


class _PendingGroup:
    """`count` consecutive steps whose metrics are still device values.

    With gradient accumulation each step's metrics arrive as `micro` values (one per
    accumulated batch) and the step's value is their mean (`grad_norm`: the last, see
    `reduce_micro`); a metric with one value per step is taken as it is.
    """

    __slots__ = ("first_step", "count", "raw", "stacked", "micro", "rows")

    def __init__(
        self, first_step: int, count: int, raw: Mapping[str, Any], stacked: bool, micro: int = 1
    ):
        self.first_step = first_step
        self.count = count
        self.raw = dict(raw)
        self.stacked = stacked
        self.micro = micro
        self.rows: list[dict[str, float]] | None = None

    def to_rows(self, arrays: Mapping[str, np.ndarray]) -> list[dict[str, float]]:
        """Per-step host rows from the fetched arrays."""
        if not self.stacked:
            return [{name: float(arr.reshape(())) for name, arr in arrays.items()}]
        per_step = {
            name: reduce_micro(name, arr, self.count, self.micro) for name, arr in arrays.items()
        }
        return [
            {name: float(values[offset]) for name, values in per_step.items()}
            for offset in range(self.count)
        ]


class MetricLog:
    """The metric half of a run: steps recorded with device values, fetched in groups.

    Args:
        plan: the frozen plan (`log_every_n_steps`, the non-finite policy).
        progress: the run's counters (step numbers, stop requests).
        callbacks: `on_step_end` is dispatched per recorded step.
        writers: the metric writers (none on processes that are not the chief).
        fetch: device values → numpy arrays, one call per group.
        history: where every written row goes.

    Attributes:
        history: the run's `History`.
        latest: the latest host value of every metric written.
        skipped_steps: under `on_nonfinite="skip"`, the skips so far.
        last_skipped: the latest skipped step, or None.
    """

    def __init__(
        self,
        plan: Plan,
        progress: Progress,
        callbacks: Callbacks,
        writers: list[Any],
        fetch: Callable[[Sequence[Any]], Sequence[Any]],
        history: History,
    ):
        self._plan = plan
        self._progress = progress
        self._callbacks = callbacks
        self.writers = writers
        self._fetch = fetch
        self.history = history
        self.latest: dict[str, float] = {}
        self.skipped_steps = 0
        self.last_skipped: int | None = None
        self._consecutive_skips = 0
        self._pending: list[_PendingGroup] = []
        self._pending_steps = 0
        self._active: _PendingGroup | None = None

    def restore(self, history: History, latest: Mapping[str, float]) -> None:
        """Continue a restored run: its history, latest values and skip count."""
        self.history = history
        self.latest = {k: float(v) for k, v in latest.items()}
        # a checkpoint is never written right after a skipped step: no run of skips is open
        self.skipped_steps = int(history.last(SKIPPED_METRIC) or 0)

    def record_step(self, metrics: Mapping[str, Any]) -> None:
        """One optimizer step finished; `metrics` may hold device scalars."""
        progress = self._progress
        progress.advance()
        self._pending.append(_PendingGroup(progress.step, 1, metrics, stacked=False))
        self._callbacks.step_end()
        self._pending_steps += 1
        self._maybe_flush()

    def record_steps(self, stacked: Mapping[str, Any], count: int, *, micro: int = 1) -> None:
        """`count` fused steps finished; each value is a device array of shape `(count,)`.

        With `micro > 1` (gradient accumulation) each value has shape `(count * micro,)`:
        one value per accumulated batch, averaged into the step's value.
        """
        progress = self._progress
        group = _PendingGroup(progress.step + 1, count, stacked, stacked=True, micro=micro)
        if self._callbacks.has_step_hooks:
            self._active = group
            try:
                for _ in range(count):
                    progress.advance()
                    self._callbacks.step_end()
            finally:
                self._active = None
        else:
            progress.advance(count)
        self._pending.append(group)
        self._pending_steps += count
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if self._pending_steps >= self._plan.log_every_n_steps:
            self.flush()

    def flush(self) -> None:
        """Fetch every pending device value in one call and write the steps in order."""
        if not self._pending:
            return
        groups, self._pending, self._pending_steps = self._pending, [], 0
        self._fetch_rows(groups)
        policy = self._plan.on_nonfinite
        for group in groups:
            for offset, row in enumerate(group.rows or ()):
                step = group.first_step + offset
                loss = row.get("loss")
                bad = loss is not None and not math.isfinite(loss)
                if policy == "skip" and loss is not None:
                    if bad:  # the backend's step left the state as it was
                        self.skipped_steps += 1
                        self._consecutive_skips += 1
                        self.last_skipped = step
                        row = {**row, SKIPPED_METRIC: float(self.skipped_steps)}
                    else:
                        self._consecutive_skips = 0
                self.write(step, row)
                if not bad or policy == "ignore":
                    continue
                limit = self._plan.max_consecutive_skips
                if policy == "stop" or (limit is not None and self._consecutive_skips >= limit):
                    # every flush comes before a validation or a checkpoint is recorded, so
                    # nothing is ever saved from a state whose history holds this step
                    from pipekit_train.core.callbacks import NonFiniteLossError

                    streak = self._consecutive_skips if policy == "skip" else None
                    raise NonFiniteLossError(step, "loss", loss, streak)  # type: ignore[arg-type]  # loss is a float once bad is set

    def _fetch_rows(self, groups: Sequence[_PendingGroup]) -> None:
        """Fill `group.rows` for every group that lacks them, with one fetch call."""
        todo = [g for g in groups if g.rows is None]
        keys: list[tuple[int, str]] = []
        values: list[Any] = []
        for gi, group in enumerate(todo):
            for name, value in group.raw.items():
                keys.append((gi, name))
                values.append(value)
        fetched = self._fetch(values) if values else []
        per_group: list[dict[str, np.ndarray]] = [{} for _ in todo]
        for (gi, name), value in zip(keys, fetched, strict=True):
            per_group[gi][name] = np.asarray(value)
        for group, arrays in zip(todo, per_group, strict=True):
            group.rows = group.to_rows(arrays)
            group.raw = {}

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        """Write host metrics of `step` to the history and the writers."""
        if not metrics:
            return
        self.latest.update(metrics)
        self.history.add(step, metrics)
        for writer in self.writers:
            writer.write(step, metrics)

    def latest_metrics(self) -> dict[str, float]:
        """The latest value of every metric (flushes pending device values first)."""
        self.flush()
        latest = dict(self.latest)
        active = self._active
        if active is not None:
            self._fetch_rows([active])
            latest.update((active.rows or [{}])[self._progress.step - active.first_step])
        return latest

    def log(self, metrics: Mapping[str, float]) -> None:
        """Write extra host metrics at the current step."""
        self.flush()
        self.write(self._progress.step, {k: float(v) for k, v in metrics.items()})

    def close_writers(self) -> None:
        """Flush and close every writer (idempotent)."""
        writers, self.writers = self.writers, []
        errors = []
        for writer in writers:
            try:
                if callable(getattr(writer, "flush", None)):
                    writer.flush()
                if callable(getattr(writer, "close", None)):
                    writer.close()
            except Exception as exc:  # close every writer, then report the first failure
                errors.append(exc)
        if errors:
            raise errors[0]
