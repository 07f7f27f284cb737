"""Checkpoint step folders on an fsspec filesystem without atomic rename (S3, GCS, memory).

A step is `<uri>/<step>/<files>`. Object stores cannot rename a folder into place, so a
step is committed by a *marker* file written last: the files go up first, then the
marker, which records their digests. A step folder without its marker was interrupted
(it is torn); a step is cleared marker first, so a half-deleted step is torn too. Each
single object PUT is atomic, so a reader never sees half a file.

Every listing drops the filesystem's listing cache first (s3fs caches listings per
instance and would not see other processes' writes).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pipekit_train.core._errors import ConfigError

from ._policy import Checkpoint

__all__ = ["RemoteSteps"]


class RemoteSteps:
    """Step folders under a `Checkpoint`'s URI location.

    Args:
        policy: a `Checkpoint` whose `directory` is a URI (`policy.is_remote`).

    Raises:
        ConfigError: the location is a local folder, or an existing file.
    """

    def __init__(self, policy: Checkpoint):
        if not policy.is_remote:
            raise ConfigError(
                f"RemoteSteps needs a URI location. Received: directory={policy.location!r}."
            )
        self.fs, self.root = policy.filesystem()
        self.location = policy.location
        self._invalidate(self.root)
        if self.fs.isfile(self.root):
            raise ConfigError(
                "`Checkpoint.directory` must be a folder, but that URI is an existing file. "
                f"Received: directory={self.location!r}. Choose a new or existing folder instead."
            )

    # -- paths --------------------------------------------------------------------------
    def path(self, step: int, name: str | None = None) -> str:
        """The filesystem path of step `step` (or of a file in it)."""
        folder = f"{self.root}/{int(step)}"
        return folder if name is None else f"{folder}/{name}"

    def uri(self, step: int) -> str:
        """The URI of step `step`."""
        return f"{self.location}/{int(step)}"

    def _invalidate(self, path: str) -> None:
        try:
            self.fs.invalidate_cache(path)
        except Exception:  # a filesystem without a listing cache
            pass

    # -- reading ------------------------------------------------------------------------
    def steps(self) -> list[int]:
        """Step folders that exist (committed or not), ascending."""
        self._invalidate(self.root)
        try:
            entries = self.fs.ls(self.root, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        out = set()
        for entry in entries:
            name = str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]
            if entry.get("type") == "directory" and name.isdigit():
                out.add(int(name))
        return sorted(out)

    def read(self, step: int, name: str) -> bytes:
        """The bytes of one file of a step (`FileNotFoundError` if it is not there)."""
        data = self.fs.cat_file(self.path(step, name))
        return bytes(data)

    def read_many(self, step: int, names: list[str]) -> dict[str, bytes]:
        """Several files of a step at once (concurrently where the filesystem can).

        Raises:
            FileNotFoundError: one of them is missing.
        """
        if not names:
            return {}
        paths = {self.path(step, n): n for n in names}
        got = self.fs.cat(list(paths), on_error="return")
        out: dict[str, bytes] = {}
        for path, name in paths.items():
            value = got.get(path, got.get(self.fs._strip_protocol(path)))
            if value is None or isinstance(value, BaseException):
                raise FileNotFoundError(f"{name} is missing")
            out[name] = bytes(value)
        return out

    def files(self, step: int) -> list[str]:
        """Every file of a step, as POSIX paths relative to the step folder."""
        folder = self.path(step)
        self._invalidate(folder)
        try:
            found = self.fs.find(folder)
        except FileNotFoundError:
            return []
        prefix = self.fs._strip_protocol(folder).rstrip("/") + "/"
        out = []
        for p in found:
            p = self.fs._strip_protocol(p)
            if p.startswith(prefix):
                out.append(p[len(prefix) :])
        return sorted(out)

    def download(self, step: int, folder: Path) -> list[str]:
        """Copy every file of a step into the local `folder`; return their names."""
        names = self.files(step)
        blobs = self.read_many(step, names)
        for name, data in blobs.items():
            target = folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return names

    # -- writing ------------------------------------------------------------------------
    def write(self, step: int, blobs: Mapping[str, bytes], *, marker: tuple[str, bytes]) -> None:
        """Commit a step: every blob, then the marker last (after clearing a stale step)."""
        self.clear(step, marker=marker[0])
        if blobs:
            self.fs.pipe({self.path(step, n): bytes(d) for n, d in blobs.items()})
        self.fs.pipe_file(self.path(step, marker[0]), marker[1])
        self._invalidate(self.path(step))

    def upload(self, step: int, folder: Path, *, marker: str) -> None:
        """Commit the local step `folder`: every file under it, then `marker` last."""
        files = sorted(
            p
            for p in folder.rglob("*")
            if p.is_file() and p.relative_to(folder).as_posix() != marker
        )
        if not (folder / marker).is_file():
            raise FileNotFoundError(f"{folder / marker} (the marker) does not exist")
        self.clear(step, marker=marker)
        if files:
            self.fs.put(
                [os.fspath(p) for p in files],
                [self.path(step, p.relative_to(folder).as_posix()) for p in files],
            )
        self.fs.put_file(os.fspath(folder / marker), self.path(step, marker))
        self._invalidate(self.path(step))

    def clear(self, step: int, *, marker: str | tuple[str, ...]) -> None:
        """Delete a step: its marker(s) first (so a half-deleted step is torn), then the rest."""
        folder = self.path(step)
        self._invalidate(folder)
        for name in (marker,) if isinstance(marker, str) else marker:
            try:
                self.fs.rm_file(self.path(step, name))
            except FileNotFoundError:
                pass
        try:
            if self.fs.exists(folder):
                self.fs.rm(folder, recursive=True)
        except FileNotFoundError:
            pass
        self._invalidate(folder)
        self._invalidate(self.root)

    def __repr__(self) -> str:
        return f"RemoteSteps({self.location!r})"
