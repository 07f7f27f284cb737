"""Where a run lease lives: one record per generation under `<location>/.pipekit-lease/`.

Each taking of the lease (a first run, a rerun after a release, a takeover) creates the
record of the next generation, `<generation>.json` (twelve digits), with an exclusive
create: `create_exclusive` on a local or shared file system (written in full, then
hard-linked into place: never half written), a conditional write on an object store
(`pipe_file(mode="create")`: S3 `If-None-Match: *`, GCS `ifGenerationMatch=0`). Of two
runs that race for a generation exactly one creates it; the other reads the winner.

The newest generation is the lease. A record is written again only by its own holder
(heartbeat, release), so no write ever needs a compare-and-swap: a holder that stalls
and wakes after a takeover writes into its own, older record, which no longer counts.
Older records are removed by the holder that superseded them.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import time
import uuid
from pathlib import Path

from pipekit_train.core._atomic import create_exclusive, stale_tmp_files, write_atomic
from pipekit_train.core._errors import CheckpointError

from ._policy import Checkpoint

__all__ = ["LEASE_DIR", "LeaseRecords"]

LEASE_DIR = ".pipekit-lease"
"""The folder of the lease's records at the root of a checkpoint location."""

_SUFFIX = ".json"
_PROBED: set[str] = set()  # object-store locations this process saw refuse a second create
_DIGITS = 12


def _name(generation: int) -> str:
    return f"{int(generation):0{_DIGITS}d}{_SUFFIX}"


def _generation(name: str) -> int | None:
    stem = name[: -len(_SUFFIX)] if name.endswith(_SUFFIX) else ""
    return int(stem) if stem.isdigit() and len(stem) == _DIGITS else None


class LeaseRecords:
    """The lease records of one checkpoint location (a local folder or an fsspec URI).

    Args:
        policy: the `Checkpoint` (its location and `storage_options`).
    """

    def __init__(self, policy: Checkpoint):
        self.location = policy.location
        self.remote = policy.is_remote
        if self.remote:
            self.fs, root = policy.filesystem()
            self.root = f"{root.rstrip('/')}/{LEASE_DIR}"
            self.local: Path | None = None
        else:
            self.fs = None
            self.local = policy.path / LEASE_DIR
            self.root = str(self.local)

    def path(self, generation: int) -> str:
        """The record of `generation` (a local path or a path on the filesystem)."""
        return f"{self.root}/{_name(generation)}"

    def _invalidate(self, path: str) -> None:
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(path)

    # -- reading ------------------------------------------------------------------------
    def generations(self) -> list[int]:
        """The generations that have a record, ascending."""
        if self.local is not None:
            try:
                names = os.listdir(self.local)
            except (FileNotFoundError, NotADirectoryError):
                return []
        else:
            self._invalidate(self.root)
            try:
                names = [
                    str(p).rstrip("/").rsplit("/", 1)[-1]
                    for p in self.fs.ls(self.root, detail=False)
                ]
            except (FileNotFoundError, NotADirectoryError):
                return []
        return sorted(g for g in map(_generation, names) if g is not None)

    def read(self, generation: int) -> bytes | None:
        """The record's bytes, or None when it does not exist (any more)."""
        if self.local is not None:
            try:
                return (self.local / _name(generation)).read_bytes()
            except FileNotFoundError:
                return None
        path = self.path(generation)
        self._invalidate(path)
        try:
            return bytes(self.fs.cat_file(path))
        except FileNotFoundError:
            return None

    def modified(self, generation: int) -> float | None:
        """When the record was last written (seconds since the epoch), or None."""
        try:
            if self.local is not None:
                return (self.local / _name(generation)).stat().st_mtime
            info = self.fs.info(self.path(generation))
        except (FileNotFoundError, OSError):
            return None
        for key in ("LastModified", "mtime", "updated", "created", "last_modified"):
            value = info.get(key)
            if isinstance(value, (int, float)):
                return float(value)
            if isinstance(value, _dt.datetime):
                return value.timestamp()
            if isinstance(value, str):
                with contextlib.suppress(ValueError):
                    return _dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        return None

    # -- writing ------------------------------------------------------------------------
    def create(self, generation: int, data: bytes) -> bool:
        """Create the record of `generation` if no run did; whether this call did."""
        if self.local is not None:
            return create_exclusive(self.local / _name(generation), data)
        path = self.path(generation)
        try:
            return self._create_at(path, data)
        finally:
            self._invalidate(path)

    def write(self, generation: int, data: bytes) -> None:
        """Rewrite the record of `generation` whole (only its holder does)."""
        if self.local is not None:
            write_atomic(self.local / _name(generation), data)
            return
        self.fs.pipe_file(self.path(generation), data)  # one PUT: all of it or nothing

    def remove(self, generation: int) -> None:
        """Remove the record of `generation` (best effort)."""
        with contextlib.suppress(FileNotFoundError, OSError):
            if self.local is not None:
                (self.local / _name(generation)).unlink()
            else:
                self.fs.rm_file(self.path(generation))

    def sweep(self, below: int, *, tmp_older_than: float) -> None:
        """Remove the records of generations below `below` (superseded) and temporary
        files a killed writer left behind; best effort."""
        for generation in self.generations():
            if generation < below:
                self.remove(generation)
        if self.local is not None:
            for tmp in stale_tmp_files(self.local, tmp_older_than, time.time()):
                with contextlib.suppress(OSError):
                    tmp.unlink()

    def probe(self) -> None:
        """Check, once per process and location, that the store refuses a second create of
        one name (an S3-compatible server may ignore `If-None-Match`).

        Raises:
            CheckpointError: the store let two creates of one name succeed.
        """
        if self.local is not None or self.location in _PROBED:
            return
        path = f"{self.root}/probe-{uuid.uuid4().hex}"
        try:
            first = self._create_at(path, b"1")
            second = self._create_at(path, b"2")
        finally:
            with contextlib.suppress(Exception):
                self.fs.rm_file(path)
        if not (first and second):
            _PROBED.add(self.location)
            return
        raise CheckpointError(
            f"The store at {self.location} accepted two conditional creates of one object "
            "(it ignores `If-None-Match: *`), so the run lease cannot keep two runs apart. "
            f"Received: checkpoint={self.location!r}. Use a store that supports conditional "
            "writes (AWS S3, GCS, MinIO, recent Ceph), or pass "
            "Checkpoint(lease_timeout=None) if you make sure that only one run at a time "
            "writes there."
        )

    def _create_at(self, path: str, data: bytes) -> bool:
        try:
            self.fs.pipe_file(path, data, mode="create")
        except FileExistsError:
            return False
        except Exception as err:
            if "PreconditionFailed" in repr(err) or "412" in str(err):
                return False
            raise
        return True
