"""The `pipekit_train.backends` entry point of the PyTorch Lightning backend (see `pyproject.toml`)."""

from __future__ import annotations

from pipekit_train.core.adapter import BackendEntry

__all__ = ["BACKEND", "TORCH"]

BACKEND = BackendEntry(
    name="lightning",
    adapter="pipekit_train.lightning:Lightning",
    model_op="pipekit_train.lightning:TorchModelOp",
    testing="pipekit_train.lightning.testing",
    distributions=("torch", "lightning", "safetensors"),
    install="pip install pipekit-train-lightning",
)

TORCH = BackendEntry(
    name="torch",
    adapter="pipekit_train.lightning:Torch",
    model_op="pipekit_train.lightning:TorchModelOp",
    testing="pipekit_train.lightning.testing",
    distributions=("torch", "safetensors"),
    install="pip install pipekit-train-lightning",
)
