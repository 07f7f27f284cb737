"""Storage primitives of the registry: exclusive create, atomic put, fresh reads.

The registry allocates version numbers with an *exclusive create* of a small claim
marker (`<name>/<version>/.claim`): whoever creates it owns the version.

- Local filesystem: core's `create_exclusive` (the marker written in full, then
  hard-linked into place: atomic on POSIX and Windows, never half written) and
  `write_atomic` (a temporary file renamed over the target), so a reader never sees
  half a file.
- S3 (s3fs): a conditional put (`If-None-Match: *`, s3fs `mode="create"`), atomic
  on AWS S3 and on S3-compatible servers that implement conditional writes. Single
  PUTs are atomic, so a reader never sees half an object.
- Any other fsspec filesystem: `pipe_file(mode="create")` where supported, which may
  be a check-then-write. The caller therefore always reads the marker back and
  checks its own token (claim-then-verify), and checks it again just before
  committing.

Every listing or existence check invalidates the filesystem's listing cache first,
because s3fs caches directory listings per instance and would otherwise not see
other processes' writes.
"""

from __future__ import annotations

from typing import Any

from pipekit_train.core._atomic import create_exclusive, create_exclusive_at, write_atomic

__all__ = ["exclusive_create", "fresh_ls", "is_local", "put_atomic", "read_or_none"]


def is_local(fs: Any) -> bool:
    """Whether `fs` is fsspec's local filesystem."""
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


def _parent(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[0]


def exclusive_create(fs: Any, path: str, data: bytes) -> bool:
    """Create `path` holding `data` only if it does not exist yet.

    Returns:
        True when this call created the file, False when it already existed.
    """
    if not data:
        raise ValueError(
            "exclusive_create needs non-empty data (s3fs writes empty files unconditionally)"
        )
    if is_local(fs):
        return create_exclusive(path, data)
    _invalidate(fs, path)
    try:
        return create_exclusive_at(fs, path, data)
    except TypeError:  # an fsspec filesystem without the `mode` argument
        if fs.exists(path):
            return False
        try:
            with fs.open(path, "xb") as f:
                f.write(data)
        except FileExistsError:
            return False
        return True
    finally:
        _invalidate(fs, path)


def put_atomic(fs: Any, path: str, data: bytes) -> None:
    """Write the whole of `data` to `path` so that readers see all of it or nothing."""
    if is_local(fs):
        write_atomic(path, data)
        return
    fs.pipe_file(path, data)  # object stores: one PUT is atomic
    _invalidate(fs, path)


def read_or_none(fs: Any, path: str) -> bytes | None:
    """The bytes at `path`, or None if it does not exist."""
    _invalidate(fs, path)
    try:
        return fs.cat_file(path)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def fresh_ls(fs: Any, path: str) -> list[str]:
    """Base names of the entries directly under `path` (empty if it does not exist)."""
    _invalidate(fs, path)
    try:
        entries = fs.ls(path, detail=False)
    except (FileNotFoundError, NotADirectoryError):
        return []
    prefix = path.rstrip("/")
    names = []
    for entry in entries:
        entry = entry.rstrip("/")
        if entry == prefix:  # some filesystems list a file as itself
            continue
        names.append(entry.rsplit("/", 1)[-1])
    return names


def _invalidate(fs: Any, path: str) -> None:
    invalidate = getattr(fs, "invalidate_cache", None)
    if invalidate is not None:
        invalidate(path)
        invalidate(_parent(path))
