"""`DirectoryCheckpointer`: a checkpoint engine of named byte blobs over a `CheckpointStore`.

Backends without a checkpoint engine of their own (the numpy reference, Lightning, Keras,
the online trainers) encode their state into named byte blobs. The store (local folder
or fsspec URI, chosen once from the policy) commits them atomically with a manifest of
SHA-256 sums, applies retention, and on restore skips torn steps with a warning.

With a `snapshot` function, the training thread only copies the state into reused host
buffers; encoding, hashing and writing run on the writer thread. A failed background
write surfaces as a `CheckpointError` at the next `poll()`, `save()`, `wait()` or `close()`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pipekit_train.core._errors import CheckpointError

from ._policy import Checkpoint
from ._store import MANIFEST, CheckpointStore, TornCheckpointWarning, TornStepError, open_store

__all__ = [
    "Checkpointer",
    "DirectoryCheckpointer",
    "Restored",
    "TornCheckpointWarning",
    "has_checkpoints",
    "step_dirs",
]

META = "meta.json"


@dataclass
class Restored:
    """What a checkpointer hands back on restore."""

    step: int
    state: Any
    meta: dict[str, Any]
    path: str


class Checkpointer(Protocol):
    """What the step driver needs from a backend's checkpoint engine."""

    def save(
        self, step: int, state: Any, meta: Mapping[str, Any], metrics: Mapping[str, float]
    ) -> str:
        """Save `state` and the JSON `meta` for `step`; return the step's path.

        Raises:
            CheckpointError: this write failed, or an earlier background one did.
        """
        ...

    def restore_latest(self, template: Any) -> Restored | None:
        """Restore the newest complete step (skipping torn ones with a warning), or None."""
        ...

    def restore_step(self, step: int, template: Any) -> Restored | None:
        """Restore the committed step `step` into `template` (as `restore_latest` restores
        the newest), or None, with a warning, when it is missing, torn or void."""
        ...

    def poll(self) -> None:
        """Raise the error of a failed background save, if any; never blocks."""
        ...

    def wait(self) -> None:
        """Block until pending background saves are committed; raise a failed one's error."""
        ...

    def close(self) -> None:
        """Wait and release resources."""
        ...


def step_dirs(root: str | os.PathLike[str] | Checkpoint) -> list[int]:
    """Committed-looking step folders (`<root>/<int>`), ascending.

    Args:
        root: a local folder, a URI (read with fsspec's defaults), or a `Checkpoint`
            (local or at a URI, read with its `storage_options`).
    """
    if not isinstance(root, Checkpoint):
        if "://" not in str(root) and not Path(root).is_dir():
            return []
        root = Checkpoint(root, lease_timeout=None)
    return open_store(root).steps()


def has_checkpoints(root: str | os.PathLike[str] | Checkpoint) -> bool:
    """Whether `root` holds any step folder (complete or not)."""
    return bool(step_dirs(root))


class DirectoryCheckpointer:
    """Checkpoint engine of named blobs: `<location>/<step>/{<blobs>, meta.json, MANIFEST.json}`.

    Args:
        policy: the `Checkpoint` policy (directory or URI, retention, async).
        encode: `state -> {filename: bytes}`, or `snapshot -> {filename: bytes}` when
            `snapshot` is given. Without `snapshot` it runs on the training thread, so it
            must copy the state to host bytes before the background write.
        decode: `({filename: bytes}, template) -> state`.
        snapshot: optional `state -> snapshot`, run on the training thread: a copy of
            everything `encode` needs (e.g. into `HostBuffers`) that the next training
            step cannot change. `encode` then runs on the writer thread. A snapshot may
            reuse its buffers from one save to the next: a save starts only after the
            previous write has finished.
        store: the `CheckpointStore` to write to (default: `open_store(policy)`).
    """

    def __init__(
        self,
        policy: Checkpoint,
        *,
        encode: Callable[[Any], Mapping[str, bytes]],
        decode: Callable[[Mapping[str, bytes], Any], Any],
        snapshot: Callable[[Any], Any] | None = None,
        store: CheckpointStore | None = None,
    ):
        self.policy = policy
        self.store = store if store is not None else open_store(policy)
        self.location = policy.location
        self._encode = encode
        self._decode = decode
        self._snapshot = snapshot
        self._pool = (
            ThreadPoolExecutor(1, thread_name_prefix="pipekit-ckpt") if policy.async_save else None
        )
        self._pending: Future[None] | None = None

    # -- saving ------------------------------------------------------------------------
    def save(
        self, step: int, state: Any, meta: Mapping[str, Any], metrics: Mapping[str, float]
    ) -> str:
        """Snapshot `state` now and commit it (in the background when `async_save`).

        Raises:
            CheckpointError: the write failed (synchronous save), or the previous
                background one did.
        """
        self.wait()
        if self._snapshot is not None:
            payload: Any = self._snapshot(state)
        else:
            payload = self._checked(self._encode(state))
        meta_bytes = json.dumps(dict(meta), sort_keys=True, allow_nan=True).encode()
        score = metrics.get(self.policy.monitor) if metrics else None
        if self._pool is None:
            self._commit(step, payload, meta_bytes, score)
        else:
            self._pending = self._pool.submit(self._commit, step, payload, meta_bytes, score)
        return self.store.step_location(step)

    @staticmethod
    def _checked(blobs: Mapping[str, bytes]) -> dict[str, bytes]:
        out = dict(blobs)
        for reserved in (MANIFEST, META):
            if reserved in out:
                raise CheckpointError(f"A backend blob may not be named {reserved!r}.")
        return out

    def _commit(self, step: int, payload: Any, meta_bytes: bytes, score: float | None) -> None:
        blobs = self._checked(self._encode(payload)) if self._snapshot is not None else payload
        blobs[META] = meta_bytes
        self.store.commit_blobs(step, blobs, score)
        try:
            self.store.prune()
        except CheckpointError:  # a `LeaseError`: this run lost the location
            raise
        except Exception as exc:
            raise CheckpointError(
                f"The checkpoint of step {step} was written to {self.store.step_location(step)}, "
                f"but deleting older checkpoints failed ({type(exc).__name__}: {exc})."
            ) from exc

    def poll(self) -> None:
        """Raise the error of a failed background save, if any; never blocks."""
        pending = self._pending
        if pending is not None and pending.done():
            self._pending = None
            pending.result()

    def wait(self) -> None:
        """Block until the pending background save (if any) is committed; re-raise its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Wait for pending saves and stop the writer thread."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            self.store.close()

    # -- restoring ---------------------------------------------------------------------
    def steps(self) -> list[int]:
        """Steps whose folder exists (not necessarily intact), ascending."""
        return self.store.steps()

    def read(self, step: int) -> tuple[dict[str, bytes], dict[str, Any]]:
        """Read and verify one step; raise `CheckpointError` if it is torn."""
        try:
            blobs = self.store.read_blobs(step)
        except TornStepError as exc:
            raise CheckpointError(str(exc)) from exc
        meta = json.loads(blobs.pop(META, b"{}").decode())
        return blobs, meta

    def _load(self, step: int, template: Any) -> Restored:
        blobs = self.store.read_blobs(step)
        meta = json.loads(blobs.pop(META, b"{}").decode())
        try:
            state = self._decode(blobs, template)
        except CheckpointError as exc:
            raise TornStepError(str(exc)) from exc
        return Restored(step=step, state=state, meta=meta, path=self.store.step_location(step))

    def restore_latest(self, template: Any) -> Restored | None:
        """Restore the newest intact step, warning about each torn step skipped."""
        self.wait()
        return self.store.restore_latest(lambda step: self._load(step, template), stacklevel=2)

    def restore_step(self, step: int, template: Any) -> Restored | None:
        """Restore step `step` (e.g. the best one), or None, with a warning, when it is
        missing, torn or void."""
        self.wait()
        return self.store.restore_step(step, lambda s: self._load(s, template), stacklevel=2)
