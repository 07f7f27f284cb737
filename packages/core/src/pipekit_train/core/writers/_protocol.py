"""The `MetricWriter` protocol."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from pipekit_train.core._errors import ConfigError

__all__ = ["MetricWriter", "check_writer"]


class MetricWriter(Protocol):
    """Where metrics go: `write(step, metrics)`, `flush()`, `close()`.

    Values arrive as host floats (wrap a writer in `AsyncWriter` to move the device→host
    transfer and the I/O off the training thread). A writer may also implement
    `state_dict()` / `load_state_dict(d)` (JSON) to continue across a resume.
    """

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record `metrics` at `step`."""
        ...

    def flush(self) -> None:
        """Make everything written so far durable / visible."""
        ...

    def close(self) -> None:
        """Flush and release resources; the writer is not used afterwards."""
        ...


def check_writer(writer: Any, *, field: str = "writers") -> Any:
    """Return `writer` if it has callable `write`, `flush` and `close`.

    Raises:
        ConfigError: a method is missing.
    """
    missing = [m for m in ("write", "flush", "close") if not callable(getattr(writer, m, None))]
    if missing:
        raise ConfigError(
            f"`{field}` holds an object that is not a metric writer: it lacks {missing}. "
            f"Received: {field} item {writer!r}. Implement write(step, metrics), flush() and "
            "close(), or use a built-in writer such as MemoryWriter or JsonlWriter."
        )
    return writer
