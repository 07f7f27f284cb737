"""`MemoryWriter`: keep every record in memory (feeds the artifact's history)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipekit_train.core._errors import ConfigError

__all__ = ["MemoryWriter"]


class MemoryWriter:
    """Record `(step, {name: value})` pairs in memory.

    Attributes:
        records: the records in write order, `[(step, {name: value}), ...]`.

    Its `state_dict()` holds the records, so the history of a resumed run includes the
    steps before the resume.
    """

    def __init__(self) -> None:
        self.records: list[tuple[int, dict[str, float]]] = []

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        """Append a record (values converted with `float`)."""
        self.records.append((int(step), {str(k): float(v) for k, v in metrics.items()}))

    def flush(self) -> None:
        """Nothing to do."""

    def close(self) -> None:
        """Nothing to do (the records stay readable)."""

    def names(self) -> list[str]:
        """Every metric name seen, in first-seen order."""
        seen: dict[str, None] = {}
        for _, metrics in self.records:
            seen.update(dict.fromkeys(metrics))
        return list(seen)

    def series(self, name: str) -> tuple[list[int], list[float]]:
        """The steps and values of one metric, in write order.

        Raises:
            ConfigError: `name` was never written (the message lists the known names).
        """
        steps = [step for step, m in self.records if name in m]
        if not steps and name not in self.names():
            raise ConfigError(
                f"`name` was never written to this MemoryWriter. Received: name={name!r}. "
                f"Known names: {self.names()}."
            )
        return steps, [m[name] for _, m in self.records if name in m]

    def state_dict(self) -> dict[str, Any]:
        """JSON state: the records."""
        return {"records": [[step, dict(m)] for step, m in self.records]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replace the records with the saved ones."""
        self.records = [
            (int(step), {k: float(v) for k, v in m.items()}) for step, m in state["records"]
        ]

    def __repr__(self) -> str:
        return f"MemoryWriter({len(self.records)} records)"
