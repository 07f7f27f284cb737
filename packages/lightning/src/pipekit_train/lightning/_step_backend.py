"""The step backend of this package: `TorchStepBackend`, plain-torch steps on core's loop.

It is `Torch()`'s (driven by core's `run_step_loop`) and `OnlineTrainer`'s on
`Lightning()`; it lives with `Torch()` in `torch/_step_backend.py`, next to the step
machinery only it uses (compile, CUDA graphs, autocast, gradient reset, data parallel).
"""

from __future__ import annotations

from .torch._step_backend import TorchStepBackend

__all__ = ["TorchStepBackend"]
