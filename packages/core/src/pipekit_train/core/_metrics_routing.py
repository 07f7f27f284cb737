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

from ._grad_norm import reduce_micro
from ._history import History

if TYPE_CHECKING:
    from ._plan import Plan
    from ._run_state import RunState

__all__ = ["SKIPPED_METRIC", "MetricRouting", "default_fetch"]

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


class MetricRouting:
    """The metric half of `RunContext` (a mixin; the context holds the state)."""

    _plan: Plan
    step: int
    _history: History
    _state: RunState
    _stop_reason: str | None
    _skipped_steps: int
    _fetch: Callable[[Sequence[Any]], Sequence[Any]]
    _lr: Callable[[], float | None] | None
    _pending: list[_PendingGroup]
    _pending_steps: int
    _latest: dict[str, float]
    _writers: list[Any]
    _step_hooks: list[Any]
    _active: _PendingGroup | None
    _consecutive_skips: int
    _last_skipped: int | None

    if TYPE_CHECKING:  # provided by RunContext

        def _sync_epoch(self) -> None: ...

    def _record_step(self, metrics: Mapping[str, Any]) -> None:
        """One optimizer step finished; `metrics` may hold device scalars."""
        self.step += 1
        self._sync_epoch()
        self._pending.append(_PendingGroup(self.step, 1, metrics, stacked=False))
        self._after_steps(1)

    def _record_steps(self, stacked: Mapping[str, Any], count: int, *, micro: int = 1) -> None:
        """`count` fused steps finished; each value is a device array of shape `(count,)`.

        With `micro > 1` (gradient accumulation) each value has shape `(count * micro,)`:
        one value per accumulated batch, averaged into the step's value.
        """
        group = _PendingGroup(self.step + 1, count, stacked, stacked=True, micro=micro)
        if self._step_hooks:
            self._active = group
            try:
                for _ in range(count):
                    self.step += 1
                    self._sync_epoch()
                    for hook in self._step_hooks:
                        hook(self._state)
            finally:
                self._active = None
        else:
            self.step += count
            self._sync_epoch()
        self._pending.append(group)
        self._pending_steps += count
        self._maybe_flush()

    def _after_steps(self, count: int) -> None:
        for hook in self._step_hooks:
            hook(self._state)
        self._pending_steps += count
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if self._pending_steps >= self._plan.log_every_n_steps:
            self.flush_metrics()

    def flush_metrics(self) -> None:
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
                        self._skipped_steps += 1
                        self._consecutive_skips += 1
                        self._last_skipped = step
                        row = {**row, SKIPPED_METRIC: float(self._skipped_steps)}
                    else:
                        self._consecutive_skips = 0
                self._write(step, row)
                if not bad or policy == "ignore":
                    continue
                limit = self._plan.max_consecutive_skips
                if policy == "stop" or (limit is not None and self._consecutive_skips >= limit):
                    # every flush comes before a validation or a checkpoint is recorded, so
                    # nothing is ever saved from a state whose history holds this step
                    from .callbacks import NonFiniteLossError

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

    def _write(self, step: int, metrics: Mapping[str, float]) -> None:
        if not metrics:
            return
        self._latest.update(metrics)
        self._history.add(step, metrics)
        for writer in self._writers:
            writer.write(step, metrics)

    def _latest_metrics(self) -> dict[str, float]:
        """The latest value of every metric (flushes pending device values first)."""
        self.flush_metrics()
        latest = dict(self._latest)
        active = self._active
        if active is not None:
            self._fetch_rows([active])
            latest.update((active.rows or [{}])[self.step - active.first_step])
        return latest

    def _log(self, metrics: Mapping[str, float]) -> None:
        """Write extra host metrics at the current step."""
        self.flush_metrics()
        self._write(self.step, {k: float(v) for k, v in metrics.items()})

    def _learning_rate(self) -> float | None:
        """The backend's current learning rate, if it reports one."""
        return None if self._lr is None else self._lr()

    def _request_stop(self, reason: str) -> None:
        """Ask the run to stop after the current step."""
        if self._stop_reason is None:
            self._stop_reason = str(reason)

    def _close_writers(self) -> None:
        """Flush and close every writer (idempotent)."""
        writers, self._writers = self._writers, []
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
