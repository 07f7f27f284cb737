"""`ProgressBar`: steps/s, loss and ETA on a terminal (tqdm or rich)."""

from __future__ import annotations

import importlib.util
import math
import numbers
import time
from typing import IO, Any

from pipekit_train.core._errors import ConfigError
from pipekit_train.core._imports import optional_import

__all__ = ["ProgressBar"]

_BACKENDS = ("auto", "tqdm", "rich")


def _fmt(value: float) -> str:
    return f"{value:.4g}"


class ProgressBar:
    """A progress bar with steps/s, the loss and the ETA.

    The bar is redrawn at most every `refresh_seconds`; `state.metrics` (which may fetch
    device values to the host) is read only at those refreshes, never on the other steps.
    The latest `val_loss` is shown next to the loss after a validation.

    Args:
        backend: `"tqdm"`, `"rich"` (extra `progress`), or `"auto"`: rich when it is
            installed, tqdm otherwise.
        refresh_seconds: minimum time between redraws.
        enabled: `True`/`False` forces the bar on/off; `None` (default) shows it only when
            `state.is_tty`.
        file: the stream to draw on (default: stderr).
        description: the text before the bar.

    Raises:
        ConfigError: a bad argument.
        ImportError: `backend="rich"` without rich installed (names the extra).
    """

    produces: tuple[str, ...] = ()
    """The metric names it adds to the run (none; see `Callback.produces`)."""

    def __init__(
        self,
        backend: str = "auto",
        refresh_seconds: float = 0.2,
        *,
        enabled: bool | None = None,
        file: IO[str] | None = None,
        description: str = "train",
    ) -> None:
        if backend not in _BACKENDS:
            raise ConfigError(
                f"`backend` must be one of {list(_BACKENDS)}. Received: backend={backend!r}. "
                "Pass 'auto' to use rich when installed and tqdm otherwise."
            )
        if (
            isinstance(refresh_seconds, bool)
            or not isinstance(refresh_seconds, numbers.Real)
            or not math.isfinite(refresh_seconds)
            or refresh_seconds < 0
        ):
            raise ConfigError(
                f"`refresh_seconds` must be a finite number >= 0. "
                f"Received: refresh_seconds={refresh_seconds!r}. Pass e.g. refresh_seconds=0.2."
            )
        if enabled is not None and not isinstance(enabled, bool):
            raise ConfigError(
                f"`enabled` must be True, False or None. Received: enabled={enabled!r}. "
                "Pass None to show the bar only on a terminal."
            )
        if backend == "rich":
            optional_import("rich", extra="progress", package="pipekit-train-core")
        self.backend: str = backend
        self.refresh_seconds: float = float(refresh_seconds)
        self.enabled: bool | None = enabled
        self.file: IO[str] | None = file
        self.description: str = description
        self._active: bool = False
        self._bar: Any = None
        self._task: Any = None
        self._kind: str = ""
        self._val_loss: float | None = None
        self._last_time: float = 0.0
        self._last_step: int = 0
        self._rate: float = 0.0

    # ------------------------------------------------------------------ hooks
    def on_train_start(self, state: Any) -> None:
        """Open the bar (when enabled) at the current step (non-zero after a resume)."""
        self._close()
        self._active = self.enabled if self.enabled is not None else bool(state.is_tty)
        if not self._active:
            return
        self._kind = self._resolve_backend()
        step, total = int(state.step), state.max_steps
        self._last_time, self._last_step, self._rate = time.monotonic(), step, 0.0
        if self._kind == "tqdm":
            from tqdm.std import tqdm

            self._bar = tqdm(
                total=total,
                initial=step,
                unit="step",
                desc=self.description,
                file=self.file,
                mininterval=0,
                dynamic_ncols=True,
                disable=False,
            )
        else:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            console = Console(file=self.file) if self.file is not None else Console(stderr=True)
            self._bar = Progress(
                TextColumn("[progress.description]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[postfix]}"),
                console=console,
                auto_refresh=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(
                self.description, total=total, completed=step, rate="", postfix=""
            )

    def on_step_end(self, state: Any) -> None:
        """Redraw when `refresh_seconds` have passed since the last redraw."""
        if not self._active:
            return
        now = time.monotonic()
        if now - self._last_time < self.refresh_seconds:
            return
        self._refresh(state, now)

    def on_validation_end(self, state: Any) -> None:
        """Remember `val_loss` to show it at the next redraw."""
        if self._active:
            value = state.metrics.get("val_loss")
            self._val_loss = None if value is None else float(value)

    def on_train_end(self, state: Any, artifact: Any) -> None:
        """Draw the final state and close the bar."""
        if self._active:
            self._refresh(state, time.monotonic())
        self._close()

    # ------------------------------------------------------------------ drawing
    def _resolve_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "rich" if importlib.util.find_spec("rich") is not None else "tqdm"

    def _refresh(self, state: Any, now: float) -> None:
        step = int(state.step)
        elapsed = now - self._last_time
        if step > self._last_step and elapsed > 0:  # else keep the last rate (final redraw)
            self._rate = (step - self._last_step) / elapsed
            self._last_time, self._last_step = now, step
        rate = self._rate
        postfix: dict[str, str] = {}
        loss = state.metrics.get("loss")
        if loss is not None:
            postfix["loss"] = _fmt(float(loss))
        if self._val_loss is not None:
            postfix["val_loss"] = _fmt(self._val_loss)
        if self._kind == "tqdm":
            self._bar.set_postfix(postfix, refresh=False)
            if step > self._bar.n:
                self._bar.update(step - self._bar.n)
            else:
                self._bar.refresh()
        else:
            self._bar.update(
                self._task,
                completed=step,
                rate=f"{rate:.2f} steps/s",
                postfix=" ".join(f"{k}={v}" for k, v in postfix.items()),
            )
            self._bar.refresh()

    def _close(self) -> None:
        bar, self._bar, self._task = self._bar, None, None
        if bar is None:
            return
        if self._kind == "tqdm":
            bar.close()
        else:
            bar.stop()

    def __repr__(self) -> str:
        return (
            f"ProgressBar(backend={self.backend!r}, refresh_seconds={self.refresh_seconds}, "
            f"enabled={self.enabled})"
        )
