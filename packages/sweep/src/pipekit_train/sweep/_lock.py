"""One writer per trial directory.

`trial_dir_lock(trial_dir)` holds an exclusive lock on `<trial_dir>/.pipekit-owner.lock`
while a trial runs, with the owner's pid, host and start time written into it. The lock
is an OS file lock (`fcntl.flock`, or `msvcrt.locking` on Windows), so the kernel releases
it when its owner dies, however it dies: a stale lock from a dead process is simply
taken over, and there is no pid to guess about. A second live writer (a worker of an
earlier sweep that is still running, a second sweep on the same directory) gets a
`TrialDirectoryInUseError` naming the owner instead of racing it.

Caveat: on network filesystems OS locks are only as good as the filesystem's lock
support (NFSv4 supports them; some FUSE mounts do not).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipekit_train.core import PipekitError

__all__ = ["LOCK_NAME", "TrialDirectoryInUseError", "trial_dir_lock"]

LOCK_NAME = ".pipekit-owner.lock"

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]  # no fcntl on Windows
    import msvcrt


class TrialDirectoryInUseError(PipekitError):
    """Another live process is writing the trial directory (it holds its owner lock)."""


def _try_lock(fd: int) -> bool:
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:  # pragma: no cover - Windows
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except OSError:
        return False
    return True


def _unlock(fd: int) -> None:
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
    else:  # pragma: no cover - Windows
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)


def read_owner(trial_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The owner record of the last process that locked `trial_dir` (None if unreadable)."""
    try:
        data = json.loads((Path(trial_dir) / LOCK_NAME).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@contextlib.contextmanager
def trial_dir_lock(trial_dir: str | os.PathLike[str]) -> Iterator[Path]:
    """Own `trial_dir` (created if missing) for the duration of the `with` block.

    Raises:
        TrialDirectoryInUseError: another live process holds the directory.
    """
    path = Path(trial_dir)
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not _try_lock(fd):
            owner = read_owner(path) or {}
            raise TrialDirectoryInUseError(
                f"The trial directory {str(path)!r} is being written by another live process "
                f"(pid={owner.get('pid')!r} on host={owner.get('host')!r}, since "
                f"{owner.get('since')!r}). Received: trial_dir={str(path)!r}. Wait for it to "
                "finish or stop it (e.g. a worker of an earlier run of this sweep) and run again."
            )
        record = json.dumps(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
        ).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0) if hasattr(os, "pwrite") else os.write(fd, record)
        os.fsync(fd)
        try:
            yield path
        finally:
            _unlock(fd)
    finally:
        os.close(fd)
