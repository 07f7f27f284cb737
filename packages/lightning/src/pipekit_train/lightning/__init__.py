"""pipekit-train-lightning: the PyTorch Lightning backend of pipekit-train.

- `Lightning(**trainer_kwargs)`: the adapter; `TrainingLoop(...).run()` trains with
  `lightning.Trainer.fit`, with core's batching, callbacks, writers, validation schedule,
  checkpoints (exact resume) and artifact.
- `Torch(steps_per_execution=..., precision=..., compile=...)`: plain PyTorch on core's
  run loop (no Lightning loop; `lightning` is never imported), with fused steps. It
  lives in the sub-package `pipekit_train.lightning.torch` with the step machinery only
  it uses.
- `TorchModelOp(factory, seed=..., **kwargs)`: a `torch.nn.Module` as a model operator
  (numpy in, numpy out; safetensors weights), trained by both adapters
  (`LightningModelOp` is the same class, under its earlier name).
- `deep_set` / `DeepSet`: a permutation-invariant embedding for sets of i.i.d. points,
  usable with any head (a model factory: `"pipekit_train.lightning:deep_set"`).

`import pipekit_train.lightning` does not import lightning itself; training with
`Lightning()` does, training with `Torch()` never does.
"""

from typing import Any as _Any

from ._adapter import Lightning
from ._embeddings import DeepSet, deep_set
from ._model import LightningModelOp, TorchModelOp
from .torch import CompileFallbackWarning, Torch

__all__ = [
    "CompileFallbackWarning",
    "DeepSet",
    "Lightning",
    "LightningModelOp",
    "Torch",
    "TorchModelOp",
    "__version__",
    "deep_set",
]


def __getattr__(name: str) -> _Any:
    # importlib.metadata costs ~0.1 s: resolve the version only when asked for.
    if name == "__version__":
        import importlib.metadata

        return importlib.metadata.version("pipekit-train-lightning")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
