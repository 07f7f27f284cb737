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
from abc import ABC, abstractmethod
from typing import Any

from pipekit_train.core._atomic import (
    create_exclusive,
    create_exclusive_at,
    stale_tmp_files,
    write_atomic,
)
from pipekit_train.core._errors import CheckpointError

from ._policy import Checkpoint

__all__ = ["LEASE_DIR", "LeaseRecords", "LocalLeaseRecords", "RemoteLeaseRecords", "lease_records"]

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


class LeaseRecords(ABC):
    """The lease records of one checkpoint location: `LocalLeaseRecords` in a local or
    shared folder, `RemoteLeaseRecords` at an fsspec URI (`lease_records` picks one).

    Attributes:
        location: the checkpoint location.
        root: the records' folder (a local path or a path on the filesystem).
    """

    location: str
    root: str

    def path(self, generation: int) -> str:
        """The record of `generation`."""
        return f"{self.root}/{_name(generation)}"

    def generations(self) -> list[int]:
        """The generations that have a record, ascending."""
        return sorted(g for g in map(_generation, self._names()) if g is not None)

    # -- the primitives of a store ------------------------------------------------------
    @abstractmethod
    def _names(self) -> list[str]:
        """The names of the entries in the records' folder (empty if it does not exist)."""

    @abstractmethod
    def read(self, generation: int) -> bytes | None:
        """The record's bytes, or None when it does not exist (any more)."""

    @abstractmethod
    def modified(self, generation: int) -> float | None:
        """When the record was last written (seconds since the epoch), or None."""

    @abstractmethod
    def create(self, generation: int, data: bytes) -> bool:
        """Create the record of `generation` if no run did; whether this call did."""

    @abstractmethod
    def write(self, generation: int, data: bytes) -> None:
        """Rewrite the record of `generation` whole (only its holder does)."""

    @abstractmethod
    def remove(self, generation: int) -> None:
        """Remove the record of `generation` (best effort)."""

    def sweep(self, below: int, *, tmp_older_than: float) -> None:
        """Remove the records of generations below `below` (superseded); best effort."""
        for generation in self.generations():
            if generation < below:
                self.remove(generation)

    def probe(self) -> None:  # noqa: B027 - a local folder needs no probe
        """Check that the store refuses a second create of one name."""


class LocalLeaseRecords(LeaseRecords):
    """Records in a local or shared folder: created with `create_exclusive` (a hard link of
    a fully written file), rewritten with `write_atomic`.

    Args:
        policy: a `Checkpoint` at a local folder.
    """

    def __init__(self, policy: Checkpoint):
        self.location = policy.location
        self.folder = policy.path / LEASE_DIR
        self.root = str(self.folder)

    def _names(self) -> list[str]:
        try:
            return os.listdir(self.folder)
        except (FileNotFoundError, NotADirectoryError):
            return []

    def read(self, generation: int) -> bytes | None:
        """The record's bytes, or None when it does not exist (any more)."""
        try:
            return (self.folder / _name(generation)).read_bytes()
        except FileNotFoundError:
            return None

    def modified(self, generation: int) -> float | None:
        """When the record was last written (its modification time), or None."""
        try:
            return (self.folder / _name(generation)).stat().st_mtime
        except OSError:
            return None

    def create(self, generation: int, data: bytes) -> bool:
        """Create the record of `generation` if no run did; whether this call did."""
        return create_exclusive(self.folder / _name(generation), data)

    def write(self, generation: int, data: bytes) -> None:
        """Rewrite the record of `generation` whole (only its holder does)."""
        write_atomic(self.folder / _name(generation), data)

    def remove(self, generation: int) -> None:
        """Remove the record of `generation` (best effort)."""
        with contextlib.suppress(OSError):
            (self.folder / _name(generation)).unlink()

    def sweep(self, below: int, *, tmp_older_than: float) -> None:
        """Remove superseded records, and temporary files that a writer killed mid-write
        left behind more than `tmp_older_than` seconds ago; best effort."""
        super().sweep(below, tmp_older_than=tmp_older_than)
        for tmp in stale_tmp_files(self.folder, tmp_older_than, time.time()):
            with contextlib.suppress(OSError):
                tmp.unlink()


class RemoteLeaseRecords(LeaseRecords):
    """Records at an fsspec URI: created with one conditional request
    (`create_exclusive_at`), rewritten with one PUT (all of it or nothing). Every read
    drops the filesystem's listing cache first (s3fs caches listings per instance).

    Args:
        policy: a `Checkpoint` at a URI.
    """

    def __init__(self, policy: Checkpoint):
        self.location = policy.location
        self.fs, root = policy.filesystem()
        self.root = f"{root.rstrip('/')}/{LEASE_DIR}"

    def _invalidate(self, path: str) -> None:
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(path)

    def _names(self) -> list[str]:
        self._invalidate(self.root)
        try:
            return [
                str(p).rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False)
            ]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def read(self, generation: int) -> bytes | None:
        """The record's bytes, or None when it does not exist (any more)."""
        path = self.path(generation)
        self._invalidate(path)
        try:
            return bytes(self.fs.cat_file(path))
        except FileNotFoundError:
            return None

    def modified(self, generation: int) -> float | None:
        """When the record was last written (the object's time), or None."""
        try:
            info: dict[str, Any] = self.fs.info(self.path(generation))
        except OSError:
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

    def create(self, generation: int, data: bytes) -> bool:
        """Create the record of `generation` if no run did; whether this call did."""
        path = self.path(generation)
        try:
            return create_exclusive_at(self.fs, path, data)
        finally:
            self._invalidate(path)

    def write(self, generation: int, data: bytes) -> None:
        """Rewrite the record of `generation` whole (only its holder does)."""
        self.fs.pipe_file(self.path(generation), data)

    def remove(self, generation: int) -> None:
        """Remove the record of `generation` (best effort)."""
        with contextlib.suppress(OSError):
            self.fs.rm_file(self.path(generation))

    def probe(self) -> None:
        """Check, once per process and location, that the store refuses a second create of
        one name (an S3-compatible server may ignore `If-None-Match`).

        Raises:
            CheckpointError: the store let two creates of one name succeed.
        """
        if self.location in _PROBED:
            return
        path = f"{self.root}/probe-{uuid.uuid4().hex}"
        try:
            first = create_exclusive_at(self.fs, path, b"1")
            second = create_exclusive_at(self.fs, path, b"2")
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


def lease_records(policy: Checkpoint) -> LeaseRecords:
    """The records of `policy`'s location: `RemoteLeaseRecords` at a URI, else local."""
    return RemoteLeaseRecords(policy) if policy.is_remote else LocalLeaseRecords(policy)
