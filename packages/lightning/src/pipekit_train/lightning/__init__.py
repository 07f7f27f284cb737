"""pipekit-train-lightning: the PyTorch Lightning backend of pipekit-train.

- `Lightning(**trainer_kwargs)`: the adapter; `TrainingLoop(...).run()` trains with
  `lightning.Trainer.fit`, with core's batching, callbacks, writers, validation schedule,
  checkpoints (exact resume) and artifact.
- `LightningModelOp(factory, seed=..., **kwargs)`: a `torch.nn.Module` as a model
  operator (numpy in, numpy out; safetensors weights).

`import pipekit_train.lightning` does not import lightning itself; training does.
"""

from typing import Any as _Any

from ._adapter import Lightning
from ._model import LightningModelOp

__all__ = ["Lightning", "LightningModelOp", "__version__"]


def __getattr__(name: str) -> _Any:
    # importlib.metadata costs ~0.1 s: resolve the version only when asked for.
    if name == "__version__":
        import importlib.metadata

        return importlib.metadata.version("pipekit-train-lightning")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
