"""The `pipekit_train.backends` entry point of the Keras 3 backend (see `pyproject.toml`)."""

from __future__ import annotations

from pipekit_train.core.adapter import BackendEntry

__all__ = ["BACKEND"]

BACKEND = BackendEntry(
    name="keras",
    adapter="pipekit_train.keras:Keras",
    model_op="pipekit_train.keras:KerasModelOp",
    testing="pipekit_train.keras.testing",
    distributions=("keras", "jax", "torch"),
    install="pip install 'pipekit-train-keras[jax]'",
)
