"""The checkpointed training state of a Keras run, and its encoding.

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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipekit_train.core import Checkpoint
from pipekit_train.core.adapter import DirectoryCheckpointer, HostBuffers

from . import _weights
from ._grad_norm import NORMS_NAME
from ._model import model_variables

__all__ = ["TrainHandle", "checkpointer"]

STATE_FILE = "state.safetensors"
INFO_FILE = "keras.json"


def _torch_rng() -> dict[str, np.ndarray]:
    import torch

    out = {"rng/torch": torch.get_rng_state().numpy().copy()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            out[f"rng/cuda/{i:03d}"] = state.numpy().copy()
    return out


def _set_torch_rng(arrays: Mapping[str, np.ndarray]) -> None:
    import torch

    torch.set_rng_state(torch.from_numpy(np.array(arrays["rng/torch"], dtype=np.uint8)))
    cuda = sorted(k for k in arrays if k.startswith("rng/cuda/"))
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(
            [torch.from_numpy(np.array(arrays[k], dtype=np.uint8)) for k in cuda]
        )


@dataclass
class TrainHandle:
    """The live training state: a compiled model and its built optimizer.

    Restoring assigns into these variables in place (the optimizer is built first:
    loading into an unbuilt Keras optimizer would silently skip its state).

    On the torch backend Keras's unseeded ops (dropout) draw from torch's global RNG,
    which is part of the state too: `start_rng()` seeds it from `seed` on a fresh run or
    applies the restored state. With `defer_rng` a restore only records the state, and
    the caller invokes `start_rng()` right before the first step (after `model.fit`'s
    data loader has drawn its own seed from the same RNG).
    """

    model: Any
    optimizer: Any
    seed: int = 0
    sync: Any = None  # () -> None: bring jax fit state back into the variables
    defer_rng: bool = False
    grad_norms: Any = None  # the `GradNormBuffer` of `log_grad_norm` runs
    _pending_rng: dict[str, np.ndarray] | None = field(default=None, repr=False)

    @property
    def torch_rng(self) -> bool:
        """Whether the global torch RNG belongs to the state (torch Keras backend)."""
        import keras

        return keras.backend.backend() == "torch"

    def start_rng(self) -> None:
        """Seed torch's global RNG from `seed`, or apply the restored state (torch only)."""
        if not self.torch_rng:
            return
        pending, self._pending_rng = self._pending_rng, None
        if pending is not None:
            _set_torch_rng(pending)
        else:
            import torch

            torch.manual_seed(int(self.seed))

    def variables(self) -> tuple[list[Any], list[Any]]:
        """`(model variables, optimizer variables)` in a stable order."""
        if self.sync is not None:
            self.sync()
        # the grad_norm ring buffer (`_grad_norm.py`) is a metric, not training state
        optimizer_vars = [v for v in self.optimizer.variables if v.name != NORMS_NAME]
        return model_variables(self.model), optimizer_vars

    def snapshot(self, buffers: HostBuffers | None = None) -> dict[str, Any]:
        """Host copies of the whole state, taken now (into `buffers`, reused between saves).

        `encode_snapshot` turns it into the checkpoint blobs, on any thread.
        """
        import keras

        buffers = HostBuffers() if buffers is None else buffers
        model_vars, opt_vars = self.variables()
        arrays: dict[str, np.ndarray] = {}
        for prefix, variables in (("model", model_vars), ("optimizer", opt_vars)):
            for name, value in _weights.arrays_of(prefix, variables).items():
                arrays[name] = buffers.copy(name, value)
        if self.torch_rng:
            arrays.update(_torch_rng())
        info = {
            "format": _weights.FORMAT,
            "keras_backend": keras.backend.backend(),
            "model_variables": len(model_vars),
            "optimizer_variables": len(opt_vars),
        }
        return {"arrays": arrays, "info": json.dumps(info, sort_keys=True).encode()}

    def encode(self) -> dict[str, bytes]:
        """Host bytes of the whole state (taken now, safe to write in the background)."""
        return encode_snapshot(self.snapshot())

    def decode(self, blobs: Mapping[str, bytes]) -> TrainHandle:
        """Assign the checkpointed arrays to the live variables (all checked first)."""
        if STATE_FILE not in blobs:
            raise KeyError(f"the checkpoint has no {STATE_FILE}")
        arrays = _weights.decode(blobs[STATE_FILE])
        model_vars, opt_vars = self.variables()
        # check both groups before assigning either: a bad blob changes nothing
        pairs = _weights.match_arrays("model", model_vars, arrays, what="The checkpoint")
        pairs += _weights.match_arrays("optimizer", opt_vars, arrays, what="The checkpoint")
        rng = {k: v for k, v in arrays.items() if k.startswith("rng/")}
        if self.torch_rng and "rng/torch" not in rng:
            raise ValueError("the checkpoint holds no torch RNG state (was it written on jax?)")
        for var, arr in pairs:
            var.assign(arr)
        if self.torch_rng:
            self._pending_rng = rng
            if not self.defer_rng:
                self.start_rng()
        return self


def encode_snapshot(snapshot: Mapping[str, Any]) -> dict[str, bytes]:
    """The checkpoint blobs of a `TrainHandle.snapshot()`."""
    return {STATE_FILE: _weights.encode(snapshot["arrays"]), INFO_FILE: snapshot["info"]}


def checkpointer(policy: Checkpoint) -> DirectoryCheckpointer:
    """Core's atomic directory store, encoding a `TrainHandle`.

    The training thread only copies the variables into host buffers reused from one save
    to the next; the safetensors encoding, hashing and writing run on the writer thread.
    """
    buffers = HostBuffers()
    return DirectoryCheckpointer(
        policy,
        snapshot=lambda handle: handle.snapshot(buffers),
        encode=encode_snapshot,
        decode=lambda blobs, template: template.decode(blobs),
    )
