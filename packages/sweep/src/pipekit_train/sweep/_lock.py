"""One writer per sweep directory and per trial directory, on core's `ExclusiveLock`.

- `sweep_dir_lock(directory)` holds `<directory>/.lock` while a sweep runs in it: a second
  sweep on the directory gets a `ConfigError` naming the owner.
- `trial_dir_lock(trial_dir)` holds `<trial_dir>/.pipekit-owner.lock` while a trial runs:
  a second live writer (a worker of an earlier sweep that is still running, a second
  sweep on the same directory) gets a `TrialDirectoryInUseError` naming the owner.

The lock is an OS file lock (`flock` on POSIX, `msvcrt` on Windows, through `filelock`),
so the operating system releases it when its owner dies, however it dies: a stale lock
from a dead process is simply taken over. The owner (pid, host, start time) is recorded
beside the lock file (`<lock>.owner.json`). On a platform with neither, `filelock` falls
back to a lock file created exclusively: a second sweep is still refused, and the error
says which file to remove after a crash.

Caveat: on network filesystems OS locks are only as good as the filesystem's lock
support (NFSv4 supports them; some FUSE mounts do not).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pipekit_train.core import ConfigError, PipekitError
from pipekit_train.core.utils import ExclusiveLock

__all__ = [
    "LOCK_NAME",
    "SWEEP_LOCK_NAME",
    "TrialDirectoryInUseError",
    "read_owner",
    "sweep_dir_lock",
    "trial_dir_lock",
]

LOCK_NAME = ".pipekit-owner.lock"
SWEEP_LOCK_NAME = ".lock"


class TrialDirectoryInUseError(PipekitError):
    """Another live process is writing the trial directory (it holds its owner lock)."""


def read_owner(trial_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The owner record of the last process that locked `trial_dir` (None if unreadable)."""
    return ExclusiveLock(Path(trial_dir) / LOCK_NAME).owner()


@contextlib.contextmanager
def _owning(lock_file: Path, refused: Callable[[ExclusiveLock], Exception]) -> Iterator[None]:
    lock = ExclusiveLock(lock_file)
    if not lock.acquire():
        raise refused(lock)
    with lock:
        yield


@contextlib.contextmanager
def trial_dir_lock(trial_dir: str | os.PathLike[str]) -> Iterator[Path]:
    """Own `trial_dir` (created if missing) for the duration of the `with` block.

    Raises:
        TrialDirectoryInUseError: another live process holds the directory.
    """
    path = Path(trial_dir)

    def refused(lock: ExclusiveLock) -> Exception:
        return TrialDirectoryInUseError(
            f"The trial directory {str(path)!r} is being written by another live process "
            f"({lock.describe_owner()}). Received: trial_dir={str(path)!r}. Wait for it to "
            "finish or stop it (e.g. a worker of an earlier run of this sweep) and run again."
        )

    with _owning(path / LOCK_NAME, refused):
        yield path


@contextlib.contextmanager
def sweep_dir_lock(directory: str | os.PathLike[str]) -> Iterator[Path]:
    """Own the sweep `directory` for the duration of the `with` block.

    Raises:
        ConfigError: another sweep runs in the directory.
    """
    path = Path(directory)

    def refused(lock: ExclusiveLock) -> Exception:
        return ConfigError(
            f"Another sweep is running in this directory ({lock.describe_owner()}). "
            f"Received: directory={str(path)!r}. Wait for it to finish, or use another "
            "directory."
        )

    with _owning(path / SWEEP_LOCK_NAME, refused):
        yield path
