"""The forward-and-loss function of the plain-torch steps, eager or `torch.compile`d.

`Objective(x, y)` is `loss(net(x), y)` under the step's autocast. With `compile=`
(opt-in) it is wrapped in `torch.compile` with those options; the backward pass then
runs the compiled backward graph. Compilation happens on the first call, which is
timed (`Objective.compile_seconds`, also logged at INFO on `pipekit_train.lightning`).
If it fails, the run warns (`CompileFallbackWarning`, with torch's error) and continues
eagerly from that first step: nothing was updated yet, so the numbers are the eager
ones, never a half-compiled mix. A compiled step may differ from the eager one by float
rounding (a compiler may reorder and fuse operations).
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ._amp import Amp

__all__ = ["CompileFallbackWarning", "Objective", "compile_options"]

_log = logging.getLogger("pipekit_train.lightning")

CUDA_GRAPHS = "cuda-graphs"
"""`Torch(compile="cuda-graphs")`: the whole update captured as a CUDA graph (`_graphs.py`);
the forward-and-loss function then runs eagerly inside the capture."""


class CompileFallbackWarning(UserWarning):
    """`torch.compile` failed; the run continues eagerly."""


def compile_options(compile: Any) -> dict[str, Any] | None:
    """The `torch.compile` keyword arguments of a `compile=` value (None: eager).

    `True` → defaults; a mode name (`"default"`, `"reduce-overhead"`, `"max-autotune"`,
    `"max-autotune-no-cudagraphs"`) → that mode; a dict → as given; `"cuda-graphs"` →
    None (not a `torch.compile` mode: the step backend captures the whole update).
    """
    if compile is False or compile is None or compile == CUDA_GRAPHS:
        return None
    if compile is True:
        return {}
    if isinstance(compile, str):
        return {"mode": compile}
    return dict(compile)


class Objective:
    """`loss(net(x), y)` under autocast, eager or compiled (see the module docs).

    Args:
        net: the module being trained.
        loss: `loss(pred, target) -> scalar tensor`.
        amp: the step's precision.
        device: the training device (for autocast).
        compile: the `compile=` option of `Torch` (False: eager).
    """

    def __init__(
        self,
        net: torch.nn.Module,
        loss: Callable[[Any, Any], Any],
        amp: Amp,
        device: torch.device,
        compile: Any = False,
    ):
        self._net, self._loss, self._amp, self._device = net, loss, amp, device
        self._options = compile_options(compile)
        self._compiled: Callable[[Any, Any], Any] | None = None
        self.compile_seconds: float | None = None
        self.fell_back: str | None = None
        if self._options is not None:
            try:
                self._compiled = torch.compile(self._eager, **self._options)
            except Exception as exc:  # e.g. an unknown backend name
                self._fall_back(exc, stacklevel=3)
        self._first = self._compiled is not None

    def _fall_back(self, exc: Exception, stacklevel: int) -> None:
        self._compiled = None
        # the whole message on one line (torch puts the backend's own error on the next)
        self.fell_back = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
        warnings.warn(
            f"torch.compile failed ({self.fell_back}); training continues eagerly. "
            f"Received: compile={self._options!r}. Use compile=False to skip the attempt.",
            CompileFallbackWarning,
            stacklevel=stacklevel,
        )

    def _eager(self, x: Any, y: Any) -> Any:
        if self._amp.dtype is None:
            return self._loss(self._net(x), y)
        with torch.autocast(device_type=self._device.type, dtype=self._amp.dtype):
            return self._loss(self._net(x), y)

    def __call__(self, x: Any, y: Any) -> Any:
        if self._compiled is None:
            if self._amp.dtype is None:
                return self._loss(self._net(x), y)
            return self._eager(x, y)
        if not self._first:
            return self._compiled(x, y)
        self._first = False
        start = time.perf_counter()
        try:
            out = self._compiled(x, y)
        except Exception as exc:  # compilation failed: eager from this first step on
            self._fall_back(exc, stacklevel=3)
            return self._eager(x, y)
        self.compile_seconds = time.perf_counter() - start
        _log.info("torch.compile of the training step: %.1f s", self.compile_seconds)
        return out

    def describe(self) -> Mapping[str, Any]:
        """`{"compiled": bool, "compile_seconds": float | None, "fell_back": str | None}`."""
        return {
            "compiled": self._compiled is not None,
            "compile_seconds": self.compile_seconds,
            "fell_back": self.fell_back,
        }
