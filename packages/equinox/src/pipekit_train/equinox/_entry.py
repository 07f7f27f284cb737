"""The `pipekit_train.backends` entry point of the Equinox/JAX backend (see `pyproject.toml`)."""

from __future__ import annotations

from pipekit_train.core.adapter import BackendEntry

__all__ = ["BACKEND"]

BACKEND = BackendEntry(
    name="equinox",
    adapter="pipekit_train.equinox:Equinox",
    model_op="pipekit_train.equinox:EquinoxModelOp",
    testing="pipekit_train.equinox.testing",
    distributions=("jax", "jaxlib", "equinox", "optax", "orbax-checkpoint"),
    install="pip install pipekit-train-equinox",
    supplied_kwargs=("key",),  # EquinoxModelOp calls factory(**kwargs, key=PRNGKey(seed))
)
