"""The checkpoint engine of a Keras run: a `TrainState` as checkpoint blobs, and back.

A checkpoint step folder (written atomically by core's `DirectoryCheckpointer`) holds
`state.safetensors` with every model variable (weights and RNG seed-generator states,
keys `model/<i>`), every optimizer variable (iterations, moments, accumulators, loss
scale; keys `optimizer/<i>`) and, on the torch backend, the global torch RNG states
(`rng/torch`, `rng/cuda/<i>`: Keras's unseeded dropout draws from them there);
`keras.json` with the variable counts and the Keras backend; and core's `meta.json`
(step, data iterator state, run state).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from pipekit_train.core.adapter import Checkpoint, DirectoryCheckpointer, HostBuffers

from . import _weights

if TYPE_CHECKING:
    from ._state import TrainState

__all__ = ["checkpointer", "encode_snapshot", "restore", "snapshot"]

STATE_FILE = "state.safetensors"
INFO_FILE = "keras.json"


def snapshot(state: TrainState, buffers: HostBuffers | None = None) -> dict[str, Any]:
    """Host copies of the whole state, taken now (into `buffers`, reused between saves).

    `encode_snapshot` turns it into the checkpoint blobs, on any thread.
    """
    import keras

    buffers = HostBuffers() if buffers is None else buffers
    model_vars, opt_vars = state.variables()
    arrays: dict[str, np.ndarray] = {}
    for prefix, variables in (("model", model_vars), ("optimizer", opt_vars)):
        for name, value in _weights.arrays_of(prefix, variables).items():
            arrays[name] = buffers.copy(name, value)
    arrays.update(state.rng_state())
    info = {
        "format": _weights.FORMAT,
        "keras_backend": keras.backend.backend(),
        "model_variables": len(model_vars),
        "optimizer_variables": len(opt_vars),
    }
    return {"arrays": arrays, "info": json.dumps(info, sort_keys=True).encode()}


def encode_snapshot(snapshot: Mapping[str, Any]) -> dict[str, bytes]:
    """The checkpoint blobs of a `snapshot(state)`."""
    return {STATE_FILE: _weights.encode_arrays(snapshot["arrays"]), INFO_FILE: snapshot["info"]}


def restore(state: TrainState, blobs: Mapping[str, bytes]) -> TrainState:
    """Assign the checkpointed arrays to the state's live variables (all checked first).

    Raises:
        KeyError: the checkpoint has no state file.
        ValueError: an array does not match its variable, or a torch-backend state has no
            torch RNG state; nothing is assigned then.
    """
    if STATE_FILE not in blobs:
        raise KeyError(f"the checkpoint has no {STATE_FILE}")
    arrays = _weights.decode_arrays(blobs[STATE_FILE])
    model_vars, opt_vars = state.variables()
    # check both groups before assigning either: a bad blob changes nothing
    pairs = _weights.match_arrays("model", model_vars, arrays, what="The checkpoint")
    pairs += _weights.match_arrays("optimizer", opt_vars, arrays, what="The checkpoint")
    rng = {k: v for k, v in arrays.items() if k.startswith("rng/")}
    if state.torch_rng and "rng/torch" not in rng:
        raise ValueError("the checkpoint holds no torch RNG state (was it written on jax?)")
    for var, arr in pairs:
        var.assign(arr)
    state.restore_rng(rng)
    return state


def checkpointer(policy: Checkpoint) -> DirectoryCheckpointer:
    """Core's atomic directory store, encoding a `TrainState`.

    The training thread only copies the variables into host buffers reused from one save
    to the next; the safetensors encoding, hashing and writing run on the writer thread.
    """
    buffers = HostBuffers()
    return DirectoryCheckpointer(
        policy,
        snapshot=lambda state: snapshot(state, buffers),
        encode=encode_snapshot,
        decode=lambda blobs, template: restore(template, blobs),
    )
