"""`without_nvml_check`: train without the per-step NVML query that `import lightning` turns on.

`import lightning` sets `PYTORCH_NVML_BASED_CUDA_CHECK=1` for the whole process. With it
set, every `torch.cuda.is_available()` — which `torch.optim.Optimizer.step` calls on every
update — loads and queries NVML: 0.1–0.3 ms per step on a GPU-less host, more than a
small model's whole step. The variable guards against initialising CUDA before a fork;
both torch adapters refuse forking strategies and DataLoader workers do not use CUDA, so
they unset it while they train (`Lightning()` and `Torch()` alike: a script that imports
lightning anywhere would otherwise slow every `Torch()` step).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["NVML_CHECK", "without_nvml_check"]

NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


@contextmanager
def without_nvml_check() -> Iterator[None]:
    """Unset `PYTORCH_NVML_BASED_CUDA_CHECK` inside the block; restore it after."""
    saved = os.environ.get(NVML_CHECK)
    if saved is None:
        yield
        return
    del os.environ[NVML_CHECK]
    try:
        yield
    finally:
        os.environ[NVML_CHECK] = saved
