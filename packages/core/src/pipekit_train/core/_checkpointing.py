"""An atomic, torn-write-safe checkpoint store on a local directory or any fsspec URI.

Backends without a checkpoint engine of their own (the numpy reference, Lightning, Keras,
the online trainers) encode their state into named byte blobs. On a local directory this
store writes them into a temporary folder, records a manifest of SHA-256 sums last, and
renames the folder into place. On a URI (S3, GCS, memory: no atomic rename) it writes
the blobs into the step folder and the manifest last, as the step's commit marker. A
step folder without a valid manifest, or whose files do not match it, is *torn*:
restore skips it with a warning and falls back to the previous step.

With a `snapshot` function, the training thread only copies the state into reused host
buffers; encoding, hashing and writing run on the writer thread.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import uuid
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ._checkpoint import Checkpoint
from ._errors import CheckpointError
from ._remote import RemoteSteps

__all__ = [
    "Checkpointer",
    "DirectoryCheckpointer",
    "Restored",
    "TornCheckpointWarning",
    "fsync_dir",
    "has_checkpoints",
    "step_dirs",
]

MANIFEST = "MANIFEST.json"
META = "meta.json"


class TornCheckpointWarning(UserWarning):
    """A checkpoint step was incomplete or damaged and was skipped."""


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
        """Save `state` and the JSON `meta` for `step`; return the step's path."""
        ...

    def restore_latest(self, template: Any) -> Restored | None:
        """Restore the newest complete step (skipping torn ones with a warning), or None."""
        ...

    def wait(self) -> None:
        """Block until pending background saves are committed."""
        ...

    def close(self) -> None:
        """Wait and release resources."""
        ...


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries to disk (after a rename into it); best effort."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def step_dirs(root: str | os.PathLike[str] | Checkpoint) -> list[int]:
    """Committed-looking step folders (`<root>/<int>`), ascending.

    Args:
        root: a local folder, a URI (read with fsspec's defaults), or a `Checkpoint`
            (local or at a URI, read with its `storage_options`).
    """
    if isinstance(root, str) and "://" in root:
        root = Checkpoint(root)
    if isinstance(root, Checkpoint):
        if root.is_remote:
            return RemoteSteps(root).steps()
        root = root.path
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.is_dir() and p.name.isdigit())


def has_checkpoints(root: str | os.PathLike[str] | Checkpoint) -> bool:
    """Whether `root` holds any step folder (complete or not)."""
    return bool(step_dirs(root))


class DirectoryCheckpointer:
    """Atomic checkpoint store: `<directory>/<step>/{<blobs>, meta.json, MANIFEST.json}`.

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
    """

    def __init__(
        self,
        policy: Checkpoint,
        *,
        encode: Callable[[Any], Mapping[str, bytes]],
        decode: Callable[[Mapping[str, bytes], Any], Any],
        snapshot: Callable[[Any], Any] | None = None,
    ):
        self.policy = policy
        self.remote = RemoteSteps(policy) if policy.is_remote else None
        self.root = None if self.remote is not None else policy.path
        self.location = policy.location
        self._encode = encode
        self._decode = decode
        self._snapshot = snapshot
        self._pool = (
            ThreadPoolExecutor(1, thread_name_prefix="pipekit-ckpt") if policy.async_save else None
        )
        self._pending: Future[None] | None = None
        self._lock = threading.Lock()
        self._scores: dict[int, float | None] = {}

    # -- saving ------------------------------------------------------------------------
    def save(
        self, step: int, state: Any, meta: Mapping[str, Any], metrics: Mapping[str, float]
    ) -> str:
        """Snapshot `state` now and commit it (in the background when `async_save`)."""
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
        return self._step_location(step)

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
        if self.remote is not None:
            self._write_remote(step, blobs, score)
        else:
            self._write(step, blobs, score)

    def _manifest(
        self, step: int, blobs: Mapping[str, bytes], score: float | None
    ) -> dict[str, Any]:
        files = {name: {"sha256": _sha256(data), "size": len(data)} for name, data in blobs.items()}
        return {"step": step, "files": files, "score": score}

    def _write_remote(self, step: int, blobs: dict[str, bytes], score: float | None) -> None:
        assert self.remote is not None
        marker = json.dumps(self._manifest(step, blobs, score), sort_keys=True).encode()
        self.remote.write(step, blobs, marker=(MANIFEST, marker))
        with self._lock:
            self._scores[step] = score
        self._prune()

    def _write(self, step: int, blobs: dict[str, bytes], score: float | None) -> None:
        assert self.root is not None
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-{step}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        files: dict[str, dict[str, Any]] = {}
        manifest = {"step": step, "files": files, "score": score}
        for name, data in blobs.items():
            with open(tmp / name, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            files[name] = {"sha256": _sha256(data), "size": len(data)}
        with open(tmp / MANIFEST, "w") as fh:
            json.dump(manifest, fh, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        fsync_dir(tmp)
        final = self.root / str(step)
        if final.exists():  # a re-save of the same step after a resume
            trash = self.root / f".trash-{step}-{uuid.uuid4().hex[:8]}"
            os.replace(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(tmp, final)
        fsync_dir(self.root)
        with self._lock:
            self._scores[step] = score
        self._prune()

    def _prune(self) -> None:
        steps = self.steps()
        for s in steps:
            if s not in self._scores:
                self._scores[s] = self._read_score(s)
        keep = self.policy.retained(steps, self._scores)
        for s in steps:
            if s not in keep:
                if self.remote is not None:
                    self.remote.clear(s, marker=MANIFEST)
                else:
                    assert self.root is not None
                    shutil.rmtree(self.root / str(s), ignore_errors=True)
                self._scores.pop(s, None)

    def _read_score(self, step: int) -> float | None:
        try:
            if self.remote is not None:
                return json.loads(self.remote.read(step, MANIFEST)).get("score")
            assert self.root is not None
            with open(self.root / str(step) / MANIFEST) as fh:
                return json.load(fh).get("score")
        except (OSError, ValueError, AttributeError):
            return None

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

    # -- restoring ---------------------------------------------------------------------
    def steps(self) -> list[int]:
        """Steps whose folder exists (not necessarily intact), ascending."""
        if self.remote is not None:
            return self.remote.steps()
        assert self.root is not None
        return step_dirs(self.root)

    def _step_location(self, step: int) -> str:
        if self.remote is not None:
            return self.remote.uri(step)
        assert self.root is not None
        return str(self.root / str(step))

    def read(self, step: int) -> tuple[dict[str, bytes], dict[str, Any]]:
        """Read and verify one step; raise `CheckpointError` if it is torn."""
        if self.remote is not None:
            return self._read_remote(step)
        assert self.root is not None
        folder = self.root / str(step)
        try:
            with open(folder / MANIFEST) as fh:
                manifest = json.load(fh)
        except FileNotFoundError as exc:
            raise CheckpointError(f"step {step} has no {MANIFEST} (an interrupted write)") from exc
        except ValueError as exc:
            raise CheckpointError(f"step {step} has an unreadable {MANIFEST}") from exc
        blobs: dict[str, bytes] = {}
        for name, info in manifest.get("files", {}).items():
            try:
                data = (folder / name).read_bytes()
            except OSError as exc:
                raise CheckpointError(f"step {step} is missing {name}") from exc
            if _sha256(data) != info.get("sha256"):
                raise CheckpointError(f"step {step}: {name} does not match its SHA-256")
            blobs[name] = data
        meta = json.loads(blobs.pop(META, b"{}").decode())
        return blobs, meta

    def _read_remote(self, step: int) -> tuple[dict[str, bytes], dict[str, Any]]:
        assert self.remote is not None
        try:
            manifest = json.loads(self.remote.read(step, MANIFEST))
            files = manifest["files"]
            if not isinstance(files, dict):
                raise TypeError("files")
        except FileNotFoundError as exc:
            raise CheckpointError(
                f"step {step} has no {MANIFEST} (an interrupted write: the marker is written last)"
            ) from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"step {step} has an unreadable {MANIFEST}") from exc
        try:
            blobs = self.remote.read_many(step, sorted(files))
        except FileNotFoundError as exc:
            raise CheckpointError(f"step {step} is missing a file: {exc}") from exc
        for name, info in sorted(files.items()):
            if not isinstance(info, dict) or _sha256(blobs[name]) != info.get("sha256"):
                raise CheckpointError(f"step {step}: {name} does not match its SHA-256")
        meta = json.loads(blobs.pop(META, b"{}").decode())
        return blobs, meta

    def restore_latest(self, template: Any) -> Restored | None:
        """Restore the newest intact step, warning about each torn step skipped."""
        self.wait()
        self._cleanup_tmp()
        for step in reversed(self.steps()):
            try:
                blobs, meta = self.read(step)
                state = self._decode(blobs, template)
            except (CheckpointError, ValueError, KeyError, OSError) as exc:
                warnings.warn(
                    f"Skipping torn checkpoint at {self._step_location(step)}: {exc}. "
                    "Falling back to the previous checkpoint.",
                    TornCheckpointWarning,
                    stacklevel=2,
                )
                continue
            return Restored(step=step, state=state, meta=meta, path=self._step_location(step))
        return None

    def _cleanup_tmp(self) -> None:
        if self.root is None or not self.root.is_dir():
            return
        for p in self.root.iterdir():
            if p.name.startswith((".tmp-", ".trash-")):
                shutil.rmtree(p, ignore_errors=True)
