"""The model's weights as bytes and back: `eqx.tree_serialise_leaves` of the model (and its
layer state), `encode_weights` / `decode_weights`.

The same weights give the same bytes. Loading checks the bytes against the model they
go into (leaf count, shapes, dtypes) and says what did not fit.
"""

from __future__ import annotations

import io
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PyTree

import equinox as eqx
from pipekit_train.core.adapter import ConfigError

__all__ = ["host_array", "decode_weights", "encode_weights"]


def host_array(x: Any) -> Any:
    """A plain single-device copy of a (possibly sharded, multi-process) array."""
    if not isinstance(x, jax.Array):
        return x
    if not x.is_fully_addressable and not x.is_fully_replicated:
        from jax.experimental import multihost_utils

        return jnp.asarray(multihost_utils.process_allgather(x, tiled=True))
    return jnp.asarray(np.asarray(jax.device_get(x)))


def encode_weights(tree: PyTree) -> bytes:
    """The model's weights as bytes: the arrays of `tree` (the module, or `(module, layer
    state)`; host copies) via `eqx.tree_serialise_leaves`."""
    buf = io.BytesIO()
    eqx.tree_serialise_leaves(buf, jax.tree.map(host_array, tree))
    return buf.getvalue()


def decode_weights(blob: bytes, like: PyTree, *, factory: str) -> PyTree:
    """`like` with the arrays of `blob` (from `encode_weights` of the same structure).

    Args:
        blob: the serialised weights.
        like: the tree they go into (its structure, shapes and dtypes).
        factory: the model's factory, named in the error messages.

    Raises:
        ConfigError: the bytes do not fit `like` (other leaves, shapes or dtypes).
    """
    buf = io.BytesIO(bytes(blob))
    try:
        tree = eqx.tree_deserialise_leaves(buf, like)
    except Exception as exc:  # np.load raises several kinds on bad bytes
        raise ConfigError(
            f"The weight bytes do not fit this model ({exc}). Received: {len(blob)} bytes for "
            f"factory={factory!r}. Load weights saved from the same factory and kwargs."
        ) from exc
    if buf.read(1):
        raise ConfigError(
            f"The weight bytes hold more leaves than this model. Received: {len(blob)} bytes for "
            f"factory={factory!r}. Load weights saved from the same factory and kwargs."
        )
    for new, old in zip(jax.tree.leaves(tree), jax.tree.leaves(like), strict=True):
        if eqx.is_array(old) and (
            jnp.shape(new) != jnp.shape(old) or jnp.result_type(new) != jnp.result_type(old)
        ):
            raise ConfigError(
                "The weight bytes do not fit this model. Received: an array of shape "
                f"{jnp.shape(new)} {jnp.result_type(new)} where the model has {jnp.shape(old)} "
                f"{jnp.result_type(old)}. Load weights saved from the same factory and kwargs."
            )
    return tree
