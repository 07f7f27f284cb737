"""A real, tiny filesystem for tests of what happens when a checkpoint disk fills up."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

__all__ = ["SmallFilesystemUnavailable", "small_filesystem"]


class SmallFilesystemUnavailable(RuntimeError):
    """Mounting a tmpfs is not permitted here (it needs root, or CAP_SYS_ADMIN)."""


@contextlib.contextmanager
def small_filesystem(path: str | os.PathLike[str], size: str = "256k") -> Iterator[Path]:
    """Mount a `size` tmpfs at `path` (created if missing) and unmount it afterwards.

    Writes beyond `size` fail with `OSError(ENOSPC)`, as on a full disk.

    Raises:
        SmallFilesystemUnavailable: the `mount` is refused (not root, or a sandbox
            without CAP_SYS_ADMIN).
    """
    target = Path(path)
    target.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0777", "tmpfs", os.fspath(target)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SmallFilesystemUnavailable(proc.stderr.strip() or f"mount exited {proc.returncode}")
    try:
        yield target
    finally:
        if subprocess.run(["umount", os.fspath(target)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", os.fspath(target)], capture_output=True)
