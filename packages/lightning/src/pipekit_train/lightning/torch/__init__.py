"""`Torch()`: plain PyTorch on core's step loop, with the step machinery only it needs.

The adapter (`_adapter.py`) and its step backend (`_step_backend.py`: `TorchStepBackend`,
also `OnlineTrainer`'s on `Lightning()`), with what the plain-torch update is built
from: the forward-and-loss function, eager or `torch.compile`d (`_compile.py`), the
whole update as a CUDA graph (`_graphs.py`), autocast and the grad scaler (`_amp.py`),
the gradient reset (`_grads.py`), data parallel over a process group
(`_distributed.py`) and whether a module draws random numbers (`_determinism.py`).
What it shares with `Lightning()` (model operator, state, checkpoints, weights,
optimizer, data, ...) is the lightning package's root modules, which take from core only
its adapter contract. Nothing here imports `lightning`.

`import torch` inside this package is torch itself (absolute imports); this package is
`pipekit_train.lightning.torch`.
"""

from ._adapter import Torch
from ._compile import CompileFallbackWarning

__all__ = ["CompileFallbackWarning", "Torch"]
