"""One atomic write, one exclusive create and one lock for every local file the packages share.

- `write_atomic(path, data)`: readers see the old file or the whole new one, never a
  part: the bytes go to a temporary file beside `path`, are flushed and fsync'd, then
  renamed over `path` (`os.replace`) and the folder is fsync'd. A failure (a full disk)
  removes the temporary file and leaves `path` as it was.
- `create_exclusive(path, data)`: create `path` holding `data` only if it does not exist,
  and never leave it half written: the bytes are written and fsync'd into a temporary
  file first, which is then hard-linked to `path` (`os.link` fails if `path` exists,
  atomically, on local and network file systems). A kill or a full disk before the link
  leaves no `path` at all. Where hard links are not supported (FAT, some FUSE mounts) it
  falls back to `O_CREAT | O_EXCL` and a write, which a kill can leave short; the callers
  treat a short file as damaged (see the run lease).
- `ExclusiveLock(path)`: a non-blocking exclusive lock on a lock file, on `filelock`:
  `flock` on POSIX, `msvcrt` locking on Windows, released by the operating system when
  the holder dies however it dies. Where neither exists, `filelock` falls back to a lock
  file created exclusively (`soft`): a second holder is still refused, but a crashed
  holder's file stays until it is removed.

The registry's claims, the checkpoint digests and stores, the run lease and the sweeps
all write through these, so a fix to one is a fix to all.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "ExclusiveLock",
    "create_exclusive",
    "create_exclusive_at",
    "fsync_dir",
    "stale_tmp_files",
    "tmp_name",
    "write_atomic",
    "write_new",
]

_TMP_PREFIX = ".tmp-"
# test hooks: `create_exclusive` calls `_HOOKS["create:link"]()`, when set, between writing
# the file and making it visible (`pipekit_train.core.testing.lease_failpoint`)
_HOOKS: dict[str, Callable[[], None]] = {}
# `os.link` errors that mean "this file system has no hard links", not "the name exists"
_NO_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.ENOSYS, errno.EMLINK}


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a folder's entries to disk (after a rename into it); best effort."""
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


def tmp_name(path: str | os.PathLike[str]) -> Path:
    """A fresh temporary name beside `path` (`.tmp-<name>.<random>`)."""
    target = Path(path)
    return target.with_name(f"{_TMP_PREFIX}{target.name}.{uuid.uuid4().hex[:12]}")


def write_new(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` into the new file `path` and flush it to disk (a file of a folder that
    is renamed into place whole afterwards, like a checkpoint step)."""
    _write_fsynced(Path(path), data, os.O_WRONLY | os.O_CREAT | os.O_EXCL)


def _write_fsynced(path: Path, data: bytes, flags: int) -> None:
    fd = os.open(path, flags | getattr(os, "O_BINARY", 0), 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace `path` by `data` so that a reader sees all of it or the old file.

    Raises:
        OSError: the write failed (nothing changed at `path`).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(target)
    try:
        _write_fsynced(tmp, data, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(target.parent)


def create_exclusive(path: str | os.PathLike[str], data: bytes) -> bool:
    """Create `path` holding all of `data` if it does not exist yet.

    Returns:
        True when this call created it, False when it existed already.

    Raises:
        OSError: the write failed (a full disk): `path` was not created.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(target)
    try:
        _write_fsynced(tmp, data, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        hook = _HOOKS.get("create:link")
        if hook is not None:
            hook()
        try:
            os.link(tmp, target)
        except FileExistsError:
            # NFS may answer EEXIST to a retried link that did succeed: our inode then
            # has two names
            with contextlib.suppress(OSError):
                if os.stat(tmp).st_nlink == 2:
                    return True
            return False
        except OSError as exc:
            if exc.errno not in _NO_LINKS:
                raise
            return _create_in_place(target, data)
        return True
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
        fsync_dir(target.parent)


def _create_in_place(target: Path, data: bytes) -> bool:
    """`O_CREAT | O_EXCL` and a write: for file systems without hard links. A write that
    fails removes the file it created; only a kill between the two can leave it short."""
    try:
        _write_fsynced(target, data, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return False
    except BaseException:
        with contextlib.suppress(OSError):
            target.unlink()
        raise
    return True


def create_exclusive_at(fs: Any, path: str, data: bytes) -> bool:
    """Create `path` on the fsspec filesystem `fs` only if it does not exist, in one
    conditional request (`pipe_file(mode="create")`: S3 `If-None-Match: *`, GCS
    `ifGenerationMatch=0`).

    Returns:
        True when this call created it, False when it existed already.

    Raises:
        TypeError: the filesystem's `pipe_file` takes no `mode`.
    """
    try:
        fs.pipe_file(path, data, mode="create")
    except FileExistsError:
        return False
    except TypeError:
        raise
    except Exception as err:  # a failed precondition surfaced as the store's own error
        text = f"{err!r} {err}"
        if "precondition" in text.lower() or "412" in text:
            return False
        raise
    return True


def stale_tmp_files(folder: str | os.PathLike[str], older_than: float, now: float) -> list[Path]:
    """Temporary files of `write_atomic`/`create_exclusive` in `folder` older than
    `older_than` seconds (left by a process killed mid-write)."""
    out = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if entry.name.startswith(_TMP_PREFIX):
                with contextlib.suppress(OSError):
                    if now - entry.stat().st_mtime > older_than:
                        out.append(Path(entry.path))
    return out


class ExclusiveLock:
    """A non-blocking exclusive lock on the file `path` (see the module docstring).

    Who holds it is recorded beside it, in `<path>.owner.json` (pid, host, since),
    written atomically once the lock is taken, for the refusal a second holder gets.

    Args:
        path: the lock file (created if missing; left in place on release, except a
            soft lock's).

    Attributes:
        soft: whether the platform offers no OS lock, so a crashed holder's lock file
            must be removed by hand.
        owner_path: the owner record beside the lock file.
    """

    def __init__(self, path: str | os.PathLike[str]):
        import filelock

        self.path = Path(path)
        self.owner_path = self.path.with_name(f"{self.path.name}.owner.json")
        self._lock = filelock.FileLock(os.fspath(self.path), timeout=0)
        self.soft = not isinstance(self._lock, (filelock.UnixFileLock, filelock.WindowsFileLock))

    def acquire(self) -> bool:
        """Take the lock and record this process as its owner; False (and nothing held,
        nothing written) when another holder has it."""
        import filelock

        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire(timeout=0)
        except filelock.Timeout:
            return False
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        try:
            write_atomic(self.owner_path, json.dumps(record).encode())
        except BaseException:
            self.release()
            raise
        return True

    def owner(self) -> dict[str, Any] | None:
        """The owner record of the last process that took the lock (None if unreadable)."""
        try:
            data = json.loads(self.owner_path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def describe_owner(self) -> str:
        """`pid=4711 on host='n12', since '2026-12-07T10:00:00+0000'` (or what is known)."""
        owner = self.owner() or {}
        text = (
            f"pid={owner.get('pid')!r} on host={owner.get('host')!r}, since {owner.get('since')!r}"
        )
        if self.soft:
            text += (
                f"; this platform has no OS file locks, so if that process is gone, remove "
                f"{str(self.path)!r}"
            )
        return text

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        return bool(self._lock.is_locked)

    def release(self) -> None:
        """Release the lock (idempotent)."""
        if self._lock.is_locked:
            self._lock.release(force=True)

    def __enter__(self) -> ExclusiveLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
