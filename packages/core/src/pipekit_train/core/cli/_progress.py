"""`ProgressLines`: plain progress lines for logs (batch jobs have no terminal to redraw)."""

from __future__ import annotations

import sys
import time
from typing import IO, Any

__all__ = ["ProgressLines"]


def _fmt(metrics: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.6g}" for k, v in sorted(metrics.items()))


class ProgressLines:
    """Print one line at the start, every `interval_s`, after each validation and checkpoint.

    `state.metrics` (which may fetch device values) is read only when a line is printed.
    Each line is flushed at once, so a job's log shows where the run is.

    Args:
        interval_s: the least time between two step lines.
        file: where to print (default: stdout).
    """

    def __init__(self, interval_s: float = 10.0, *, file: IO[str] | None = None) -> None:
        self.interval_s = float(interval_s)
        self.file = file
        self._start = 0.0
        self._last = 0.0
        self._first_step = 0

    def _print(self, text: str) -> None:
        print(text, file=self.file or sys.stdout, flush=True)

    def _total(self, state: Any) -> str:
        return "?" if state.max_steps is None else str(state.max_steps)

    def on_train_start(self, state: Any) -> None:
        """Say whether the run starts fresh or resumes, and at which step."""
        self._start = self._last = time.monotonic()
        self._first_step = int(state.step)
        if state.step:
            self._print(f"resumed from checkpoint at step {state.step}/{self._total(state)}")
        else:
            self._print(f"training from step 0 to {self._total(state)}")

    def on_step_end(self, state: Any) -> None:
        """A step line (loss, steps/s, ETA) when `interval_s` has passed."""
        now = time.monotonic()
        if now - self._last < self.interval_s:
            return
        self._last = now
        rate = (int(state.step) - self._first_step) / max(now - self._start, 1e-9)
        eta = ""
        if state.max_steps is not None and rate > 0:
            eta = f", ETA {max(0.0, (state.max_steps - state.step) / rate):.0f} s"
        loss = {k: v for k, v in state.metrics.items() if k == "loss"}
        self._print(
            f"step {state.step}/{self._total(state)}: {_fmt(loss)} ({rate:.1f} steps/s{eta})"
        )

    def on_validation_end(self, state: Any) -> None:
        """The validation metrics."""
        values = {k: v for k, v in state.metrics.items() if k.startswith("val_")}
        self._print(f"step {state.step}/{self._total(state)}: {_fmt(values)}")

    def on_checkpoint(self, state: Any, path: str) -> None:
        """Where the checkpoint went."""
        self._print(f"step {state.step}/{self._total(state)}: checkpoint {path}")
