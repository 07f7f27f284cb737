"""`CheckpointStore`: where checkpoint steps live, and how a step is committed.

A checkpoint engine (core's `DirectoryCheckpointer`, the Equinox adapter's Orbax engine)
decides what bytes a step holds; the store decides where they go. Chosen once from the
`Checkpoint` policy (`open_store`), it is the only code that knows whether the location
is a local folder (`LocalStore`) or an fsspec URI (`FsspecStore`):

- **Committing.** A step is written whole or not at all. Named blobs
  (`commit_blobs`) go with a `MANIFEST.json` of SHA-256 sums: locally into a temporary
  folder renamed into place, at a URI blob by blob with the manifest last (object
  stores have no atomic rename). A folder an engine filled (`engine_root`, then
  `commit_folder`) is sealed with `pipekit-digest.json` (`seal_folder`); at a URI it is
  uploaded with the digest last and the staged copy removed.
- **Failures.** A write that fails (disk full, permission denied, a dropped connection)
  raises one `CheckpointError` naming the location, the step and the latest complete
  checkpoint, after removing what the step had written (`write_failed`).
- **Retention** (`prune`): the policy's `max_to_keep` latest plus its `keep_best` best by
  `monitor`, applied after a commit. A step is deleted marker first.
- **Torn-step fallback** (`restore_latest`): the newest step whose load succeeds; each
  step the engine's loader finds torn (`TornStepError`) is skipped with a
  `TornCheckpointWarning`.
- **Fencing** (`_fencing`): a commit records the run lease generation that wrote it; a
  step that an older generation committed after a takeover is void: never restored, kept
  out of retention, removed by the lease's holder (`FencedStepWarning`). A store never
  deletes or replaces a step of a newer generation than its own: that raises `LeaseError`
  (this run lost the location).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import tempfile
import uuid
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TypeVar

from pipekit_train.core._atomic import fsync_dir, write_new
from pipekit_train.core._errors import CheckpointError

from ._digest import FOLDER_DIGEST, check_folder, seal_folder
from ._fencing import Fencing
from ._lease import LeaseError, fencing_of, held_fencing, lost_lease, may_clean
from ._policy import Checkpoint
from ._remote import RemoteSteps

__all__ = [
    "MANIFEST",
    "CheckpointStore",
    "FencedStepWarning",
    "FsspecStore",
    "LocalStore",
    "TornCheckpointWarning",
    "TornStepError",
    "open_store",
]

MANIFEST = "MANIFEST.json"
T = TypeVar("T")


class TornCheckpointWarning(UserWarning):
    """A checkpoint step was incomplete or damaged and was skipped."""


class FencedStepWarning(TornCheckpointWarning):
    """A checkpoint step was written by a run that had lost the location; it was skipped."""


class TornStepError(Exception):
    """Raised by an engine's loader: this step is incomplete or damaged (skip it)."""


def _disk_bytes(folder: Path) -> int:
    """The space a folder takes on its disk (allocated blocks, not file sizes)."""
    total = 0
    for p in [folder, *folder.rglob("*")]:
        with contextlib.suppress(OSError):
            total += p.lstat().st_blocks * 512
    return total


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _hint(exc: BaseException) -> str:
    errno = getattr(exc, "errno", None)
    if errno == 28 or "No space left" in str(exc) or "RESOURCE_EXHAUSTED" in str(exc):
        return "Free space there, or point `Checkpoint.directory` at roomier storage"
    if errno in (1, 13) or isinstance(exc, PermissionError):
        return "Make the location writable, or choose another `Checkpoint.directory`"
    return "Check that the location is reachable and writable"


class CheckpointStore(ABC):
    """Step folders under one checkpoint location; see the module docstring.

    Args:
        policy: the `Checkpoint` policy (location, retention, `monitor`/`mode`).

    Attributes:
        shared_writes: whether several processes may write an engine's step into
            `engine_root()` together (a shared local folder), or only one (a URI).
    """

    shared_writes: bool = True

    def __init__(self, policy: Checkpoint):
        self.policy = policy
        self.location = policy.location
        self._scores: dict[int, float | None] = {}
        self._latest: int | None = None
        self.last_folder_bytes: int | None = None
        self._generations: dict[int, int | None] = {}  # step → the generation that wrote it
        self._read_fencing: Fencing | None = None

    # -- the primitives of a location ---------------------------------------------------
    @abstractmethod
    def steps(self) -> list[int]:
        """Step folders that exist (complete or not), ascending."""

    @abstractmethod
    def step_location(self, step: int) -> str:
        """Where step `step` is (or would be) saved: a local path or a URI."""

    @abstractmethod
    def read(self, step: int, name: str) -> bytes:
        """The bytes of one file of a step (`FileNotFoundError` if it is not there)."""

    @abstractmethod
    def read_many(self, step: int, names: list[str]) -> dict[str, bytes]:
        """Several files of a step (`FileNotFoundError` if one is missing)."""

    @abstractmethod
    def _put_blobs(self, step: int, blobs: Mapping[str, bytes], manifest: bytes) -> None:
        """Write a step's blobs and its manifest, committing them atomically."""

    @abstractmethod
    def _put_folder(self, step: int, folder: Path) -> None:
        """Commit the sealed local `folder` as step `step`."""

    @abstractmethod
    def delete(self, step: int) -> None:
        """Delete a step, its commit marker first (a half-deleted step is torn)."""

    @abstractmethod
    def engine_root(self) -> Path:
        """A local folder an engine writes `<step>/` folders into, then `commit_folder`s."""

    @abstractmethod
    def local_copy(self, step: int) -> contextlib.AbstractContextManager[Path]:
        """A context yielding a local folder holding the files of step `step`."""

    @abstractmethod
    def _discard(self, step: int) -> None:
        """Remove whatever a failed write of `step` left behind (best effort)."""

    def cleanup(self) -> None:  # noqa: B027 - optional for a location
        """Remove leftovers of interrupted writes (temporary folders)."""

    def close(self) -> None:  # noqa: B027 - optional for a location
        """Release local staging space."""

    # -- committing ---------------------------------------------------------------------
    def commit_blobs(self, step: int, blobs: Mapping[str, bytes], score: float | None) -> str:
        """Commit named blobs as step `step` with a `MANIFEST.json` of their SHA-256 sums.

        Raises:
            CheckpointError: the write failed (the partial step is removed).
        """
        files = {n: {"sha256": _sha256(d), "size": len(d)} for n, d in blobs.items()}
        manifest = {"step": int(step), "files": files, "score": score}
        generation = held_fencing(self.policy).generation
        if generation is not None:
            manifest["generation"] = generation
        marker = json.dumps(manifest, sort_keys=True).encode()
        try:
            self.guard(step)
            self._put_blobs(int(step), blobs, marker)
        except CheckpointError:
            raise
        except Exception as exc:
            raise self.write_failed(step, exc) from exc
        self._committed(step, score)
        return self.step_location(step)

    def commit_folder(self, step: int, folder: Path, score: float | None) -> str:
        """Seal the engine-written `folder` (`pipekit-digest.json`) and commit it as `step`.

        Raises:
            CheckpointError: the write failed (the partial step is removed).
        """
        try:
            self.guard(step)
            seal_folder(folder, int(step), generation=held_fencing(self.policy).generation)
            self.last_folder_bytes = _disk_bytes(folder)
            self._put_folder(int(step), folder)
        except CheckpointError:
            raise
        except Exception as exc:
            raise self.write_failed(step, exc) from exc
        self._committed(step, score)
        return self.step_location(step)

    def reserve(self, step: int, needed: int) -> None:
        """Refuse to start writing step `step` where fewer than `needed` bytes are free.

        An engine calls this before it writes into `engine_root()`, with an estimate
        (e.g. `last_folder_bytes` of the previous step): a write that cannot fit fails
        before it starts, the same `CheckpointError` as a write that ran out of space.

        Raises:
            CheckpointError: not enough space (the disk is full).
        """
        probe = self.engine_root()
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free = shutil.disk_usage(probe).free
        if free < needed:
            exc = OSError(
                errno.ENOSPC,
                f"No space left on device (about {needed} bytes needed, {free} free)",
            )
            raise self.write_failed(step, exc)

    def _committed(self, step: int, score: float | None) -> None:
        self._generations.pop(int(step), None)
        self._scores[int(step)] = score
        self._latest = int(step)

    # -- fencing ------------------------------------------------------------------------
    def fencing(self) -> Fencing:
        """This process's generation and the location's fences (`fencing_of`)."""
        held = held_fencing(self.policy)
        if held.generation is not None:
            return held
        if self._read_fencing is None:
            self._read_fencing = fencing_of(self.policy)
        return self._read_fencing

    def marker(self, step: int) -> dict[str, object] | None:
        """A step's commit marker (`MANIFEST.json` or the folder digest), or None when the
        step was never committed (or the marker is unreadable)."""
        for name in (MANIFEST, FOLDER_DIGEST):
            try:
                record = json.loads(self.read(step, name))
            except FileNotFoundError:
                continue
            except (OSError, ValueError):
                return None
            return record if isinstance(record, dict) else None
        return None

    def written_by(self, step: int) -> int | None:
        """The lease generation that committed `step` (None: none recorded, or no commit)."""
        step = int(step)
        if step in self._generations:
            return self._generations[step]
        marker = self.marker(step)
        value = None if marker is None else marker.get("generation")
        generation = int(value) if isinstance(value, int) else None
        if marker is not None:  # a committed step's generation does not change
            self._generations[step] = generation
        return generation

    def latest_committed(self) -> int | None:
        """The newest step with a commit marker (the fence of a new lease generation)."""
        for step in reversed(self.steps()):
            if self.marker(step) is not None:
                return step
        return None

    def void_reason(self, step: int, fencing: Fencing | None = None) -> str | None:
        """Why the fences void committed step `step` (`_fencing`), or None when it is valid
        (or was never committed)."""
        fencing = self.fencing() if fencing is None else fencing
        if not fencing.fences or step <= min(s for _, s in fencing.fences):
            return None  # no fence reaches it: nothing to read
        if self.marker(step) is None:
            return None
        writer = self.written_by(step)
        fence = fencing.void(step, writer)
        if fence is None:
            return None
        return (
            f"it was written by lease generation {writer or 0} after generation {fence[0]} "
            f"took the location over at step {fence[1]} (by a run that had lost the "
            "location); it is never resumed"
        )

    def void_steps(self, steps: list[int] | None = None) -> dict[int, str]:
        """The committed steps the fences void, each with why."""
        fencing = self.fencing()
        out = {}
        for step in self.steps() if steps is None else steps:
            why = self.void_reason(step, fencing)
            if why is not None:
                out[step] = why
        return out

    def _drop_void(self, void: Mapping[int, str]) -> None:
        """The lease's holder removes void steps; a reader leaves them."""
        if held_fencing(self.policy).generation is None:
            return
        for step in void:
            with contextlib.suppress(Exception):
                self.delete(step)
            self._scores.pop(step, None)
            self._generations.pop(step, None)

    def guard(self, step: int) -> None:
        """Refuse to delete or replace `step` when a newer lease generation wrote it.

        Raises:
            LeaseError: the step is a newer holder's: this run lost the location.
        """
        fencing = held_fencing(self.policy)
        if fencing.generation is None:
            return
        self._generations.pop(int(step), None)  # read it afresh: another run may write
        writer = self.written_by(step)
        if fencing.newer(writer):
            raise LeaseError(
                f"This run (lease generation {fencing.generation}) lost its lease on "
                f"{self.location}: step {int(step)} there was written by generation {writer}. "
                "It stops writing so that it never touches the other run's steps. Received: "
                f"checkpoint={self.location!r}. Let the other run finish, or raise "
                "Checkpoint(lease_timeout=...)."
            )

    def latest_complete(self) -> str | None:
        """The location of the newest step this store committed (or found), if any.

        Raises:
            OSError: there is none known and the location cannot be listed.
        """
        if self._latest is None:
            found = self.steps()
            self._latest = found[-1] if found else None
        return None if self._latest is None else self.step_location(self._latest)

    def write_failed(self, step: int, exc: BaseException) -> CheckpointError:
        """Remove the partial step `step` and describe the failed write as a `CheckpointError`.

        When this run lost the location's lease meanwhile (its stall outlived the lease,
        and the new holder removed the write in progress), that is the error: a
        `LeaseError`, and nothing is removed (the files there are the new holder's).
        """
        lost = lost_lease(self.policy)
        if lost is not None:
            return lost
        try:
            self._discard(int(step))
            removed = "The partial step was removed."
        except Exception as cleanup:
            removed = (
                f"The partial step could not be removed ({_reason(cleanup)}); it has no commit "
                "marker, so a restore skips it."
            )
        try:
            latest = self.latest_complete()
            kept = (
                f"The latest complete checkpoint is {latest}; a rerun resumes from it."
                if latest is not None
                else "There is no complete checkpoint yet."
            )
        except Exception as listing:
            kept = f"The location cannot be listed either ({_reason(listing)})."
        return CheckpointError(
            f"Could not write the checkpoint of step {int(step)} to {self.step_location(step)} "
            f"({_reason(exc)}). {removed} {kept} {_hint(exc)}."
        )

    # -- retention ----------------------------------------------------------------------
    def prune(self, score_of: Callable[[int], float | None] | None = None) -> list[int]:
        """Apply the policy's retention to the existing steps; return the steps deleted.

        Args:
            score_of: reads the monitored score of a step this store did not commit
                (from an earlier run); without it such steps have no score.
        """
        if self.policy.max_to_keep is None:  # every step is kept: no listing to do
            return []
        all_steps = self.steps()
        void = self.void_steps(all_steps)
        self._drop_void(void)
        steps = [s for s in all_steps if s not in void]
        if self.policy.keep_best:
            for s in steps:
                if s not in self._scores:
                    self._scores[s] = self._score(s, score_of)
        keep = self.policy.retained(steps, self._scores)
        gone = [s for s in steps if s not in keep]
        for s in gone:
            self.guard(s)
            self.delete(s)
            self._scores.pop(s, None)
            self._generations.pop(s, None)
        return gone

    def _score(self, step: int, score_of: Callable[[int], float | None] | None) -> float | None:
        try:
            if score_of is not None:
                return score_of(step)
            return json.loads(self.read(step, MANIFEST)).get("score")
        except (OSError, ValueError, AttributeError, TypeError):
            return None

    def drop_from(self, step: int) -> None:
        """Delete every step `>= step` (an abandoned timeline a restore fell back past)."""
        for stale in [s for s in self.steps() if s >= step]:
            self.guard(stale)
            self.delete(stale)
            self._scores.pop(stale, None)
            self._generations.pop(stale, None)

    # -- reading ------------------------------------------------------------------------
    def read_blobs(self, step: int) -> dict[str, bytes]:
        """Read and verify a `commit_blobs` step.

        Raises:
            TornStepError: the manifest is missing or unreadable, or a blob is missing or
                does not match its SHA-256.
        """
        try:
            manifest = json.loads(self.read(step, MANIFEST))
            files = manifest["files"]
            if not isinstance(files, dict):
                raise TypeError("files")
        except FileNotFoundError as exc:
            raise TornStepError(
                f"step {step} has no {MANIFEST} (an interrupted write: it is written last)"
            ) from exc
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise TornStepError(f"step {step} has an unreadable {MANIFEST}") from exc
        try:
            blobs = self.read_many(step, sorted(files))
        except OSError as exc:
            raise TornStepError(f"step {step} is missing a file: {exc}") from exc
        for name, info in sorted(files.items()):
            if not isinstance(info, dict) or _sha256(blobs[name]) != info.get("sha256"):
                raise TornStepError(f"step {step}: {name} does not match its SHA-256")
        return blobs

    @contextlib.contextmanager
    def checked_folder(self, step: int) -> Iterator[Path]:
        """A local folder of a `commit_folder` step, checked against its digest.

        Raises:
            TornStepError: the digest is missing, or a file does not match it.
        """
        try:
            self.read(step, FOLDER_DIGEST)
        except FileNotFoundError as exc:
            raise TornStepError(
                f"it has no {FOLDER_DIGEST} (the save was interrupted before it was sealed)"
            ) from exc
        except OSError as exc:
            raise TornStepError(f"its {FOLDER_DIGEST} is unreadable ({_reason(exc)})") from exc
        with contextlib.ExitStack() as stack:
            try:
                folder = stack.enter_context(self.local_copy(step))
            except OSError as exc:
                raise TornStepError(f"it could not be read ({_reason(exc)})") from exc
            problem = check_folder(folder)
            if problem is not None:
                raise TornStepError(problem)
            yield folder

    def restore_latest(self, load: Callable[[int], T], *, stacklevel: int = 2) -> T | None:
        """`load(step)` of the newest step it does not find torn, or None.

        Every step `load` raises `TornStepError` for (or `OSError`, `ValueError`,
        `KeyError`) is skipped with a `TornCheckpointWarning`; other errors propagate.
        A void step (`void_steps`) is skipped with a `FencedStepWarning`, and removed
        when this process holds the location's lease.
        """
        self.cleanup()
        self._read_fencing = None  # read the location's fences afresh
        fencing = self.fencing()
        for step in reversed(self.steps()):
            loaded = self._try_load(
                step, load, fencing, "Falling back to the previous checkpoint.", stacklevel + 1
            )
            if loaded is not None:
                self._latest = step
                return loaded[0]
        return None

    def restore_step(self, step: int, load: Callable[[int], T], *, stacklevel: int = 2) -> T | None:
        """`load(step)` of the committed step `step`, or None when it is missing, torn or
        void (each warned about as in `restore_latest`).

        Other errors of `load` propagate.
        """
        self._read_fencing = None
        if int(step) not in self.steps():
            warnings.warn(
                f"There is no checkpoint of step {int(step)} at {self.location}.",
                TornCheckpointWarning,
                stacklevel=stacklevel + 1,
            )
            return None
        loaded = self._try_load(int(step), load, self.fencing(), "", stacklevel + 1)
        return None if loaded is None else loaded[0]

    def _try_load(
        self, step: int, load: Callable[[int], T], fencing: Fencing, then: str, stacklevel: int
    ) -> tuple[T] | None:
        """`(load(step),)`, or None after warning that the step is void or torn."""
        why = self.void_reason(step, fencing)
        if why is not None:
            warnings.warn(
                f"Skipping checkpoint {self.step_location(step)} (step {step}): {why}.",
                FencedStepWarning,
                stacklevel=stacklevel + 1,
            )
            self._drop_void({step: why})
            return None
        try:
            return (load(step),)
        except (TornStepError, OSError, ValueError, KeyError) as exc:
            warnings.warn(
                f"Skipping torn checkpoint at {self.step_location(step)} (step {step}): "
                f"{exc}. {then}".rstrip(),
                TornCheckpointWarning,
                stacklevel=stacklevel + 1,
            )
            return None


class LocalStore(CheckpointStore):
    """Steps in a local folder: each committed by renaming a finished folder into place.

    Args:
        policy: a `Checkpoint` at a local folder.
    """

    shared_writes = True

    def __init__(self, policy: Checkpoint):
        super().__init__(policy)
        self.root = policy.path

    def steps(self) -> list[int]:
        """Step folders (`<root>/<int>`), ascending."""
        if not self.root.is_dir():
            return []
        return sorted(int(p.name) for p in self.root.iterdir() if p.is_dir() and p.name.isdigit())

    def step_location(self, step: int) -> str:
        """The local path of step `step`."""
        return str(self.root / str(int(step)))

    def read(self, step: int, name: str) -> bytes:
        """The bytes of one file of a step."""
        return (self.root / str(int(step)) / name).read_bytes()

    def read_many(self, step: int, names: list[str]) -> dict[str, bytes]:
        """Several files of a step."""
        return {n: self.read(step, n) for n in names}

    def _put_blobs(self, step: int, blobs: Mapping[str, bytes], manifest: bytes) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-{step}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        for name, data in [*blobs.items(), (MANIFEST, manifest)]:
            write_new(tmp / name, data)
        fsync_dir(tmp)
        self._put_folder(step, tmp)

    def _put_folder(self, step: int, folder: Path) -> None:
        final = self.root / str(step)
        if folder.resolve() == final.resolve():
            fsync_dir(self.root)
            return
        if final.exists():  # a re-save of the same step after a resume
            self.guard(step)
            trash = self.root / f".trash-{step}-{uuid.uuid4().hex[:8]}"
            os.replace(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(folder, final)
        fsync_dir(self.root)

    def delete(self, step: int) -> None:
        """Delete a step: its markers first, then the folder."""
        folder = self.root / str(int(step))
        for marker in (MANIFEST, FOLDER_DIGEST):
            with contextlib.suppress(OSError):
                (folder / marker).unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)

    def engine_root(self) -> Path:
        """The checkpoint folder itself: an engine commits `<step>/` there atomically."""
        return self.root

    @contextlib.contextmanager
    def local_copy(self, step: int) -> Iterator[Path]:
        """The step folder itself."""
        yield self.root / str(int(step))

    def _discard(self, step: int) -> None:
        if not self.root.is_dir():
            return
        for p in self.root.iterdir():
            name = p.name
            if name.startswith((f".tmp-{step}-", f".trash-{step}-", f"{step}.")) or (
                name == str(step)
                and not (p / MANIFEST).is_file()
                and not (p / FOLDER_DIGEST).is_file()
            ):
                shutil.rmtree(p, ignore_errors=True)

    def cleanup(self) -> None:
        """Remove `.tmp-*`/`.trash-*` folders of interrupted writes (never while another
        run holds the location's lease: they may be its writes in progress)."""
        if not self.root.is_dir() or not may_clean(self.root):
            return
        for p in self.root.iterdir():
            if p.name.startswith((".tmp-", ".trash-")):
                shutil.rmtree(p, ignore_errors=True)

    def __repr__(self) -> str:
        return f"LocalStore({self.location!r})"


class FsspecStore(CheckpointStore):
    """Steps at an fsspec URI (S3, GCS, memory): committed by a marker written last.

    Engine-written folders are staged under the system temporary directory, then
    uploaded with `pipekit-digest.json` last.

    Args:
        policy: a `Checkpoint` at a URI.
    """

    shared_writes = False

    def __init__(self, policy: Checkpoint):
        super().__init__(policy)
        self.remote = RemoteSteps(policy)
        self._staging: Path | None = None

    def steps(self) -> list[int]:
        """Step folders at the URI (committed or not), ascending."""
        return self.remote.steps()

    def step_location(self, step: int) -> str:
        """The URI of step `step`."""
        return self.remote.uri(step)

    def read(self, step: int, name: str) -> bytes:
        """The bytes of one file of a step."""
        return self.remote.read(step, name)

    def read_many(self, step: int, names: list[str]) -> dict[str, bytes]:
        """Several files of a step, fetched concurrently."""
        return self.remote.read_many(step, names)

    def _put_blobs(self, step: int, blobs: Mapping[str, bytes], manifest: bytes) -> None:
        self.remote.write(step, blobs, marker=(MANIFEST, manifest))

    def _put_folder(self, step: int, folder: Path) -> None:
        self.remote.upload(step, folder, marker=FOLDER_DIGEST)
        shutil.rmtree(folder, ignore_errors=True)  # the staged copy is no longer needed

    def delete(self, step: int) -> None:
        """Delete a step, marker first."""
        self.remote.clear(step, marker=(MANIFEST, FOLDER_DIGEST))

    def _stage(self) -> Path:
        if self._staging is None:
            self._staging = Path(tempfile.mkdtemp(prefix="pipekit-ckpt-staging-"))
        return self._staging

    def engine_root(self) -> Path:
        """A staging folder under the system temporary directory."""
        return self._stage() / "write"

    @contextlib.contextmanager
    def local_copy(self, step: int) -> Iterator[Path]:
        """The step downloaded into staging (removed afterwards)."""
        folder = self._stage() / "read" / str(int(step))
        shutil.rmtree(folder, ignore_errors=True)
        try:
            self.remote.download(step, folder)
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _discard(self, step: int) -> None:
        if self._staging is not None:
            root = self.engine_root()
            if root.is_dir():
                for p in root.iterdir():
                    if p.name == str(step) or p.name.startswith(f"{step}."):
                        shutil.rmtree(p, ignore_errors=True)
        self.delete(step)

    def close(self) -> None:
        """Remove the staging folder."""
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None

    def __repr__(self) -> str:
        return f"FsspecStore({self.location!r})"


def open_store(policy: Checkpoint) -> CheckpointStore:
    """The store for a policy's location: `FsspecStore` at a URI, else `LocalStore`."""
    return FsspecStore(policy) if policy.is_remote else LocalStore(policy)
