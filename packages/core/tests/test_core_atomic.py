"""`core._atomic`: the one atomic write, exclusive create and lock of every package."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from pipekit_train.core import _atomic
from pipekit_train.core.utils import ExclusiveLock, create_exclusive, write_atomic


def test_write_atomic_replaces_whole_and_a_failed_write_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "a" / "record.json"
    write_atomic(target, b"first")
    write_atomic(target, b"second")
    assert target.read_bytes() == b"second"

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_atomic.os, "write", full)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(target, b"third")
    monkeypatch.undo()
    assert target.read_bytes() == b"second"
    assert sorted(p.name for p in target.parent.iterdir()) == ["record.json"]  # no temporary


def test_create_exclusive_creates_once_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "claim"
    assert create_exclusive(target, b"mine") is True
    assert create_exclusive(target, b"theirs") is False
    assert target.read_bytes() == b"mine"
    assert [p.name for p in tmp_path.iterdir()] == ["claim"]


def test_without_hard_links_it_creates_in_place_and_a_failed_write_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FAT, some FUSE mounts: `link` is refused, so `O_CREAT | O_EXCL` and a write; a
    write that fails removes what it created."""

    def no_links(src: object, dst: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(_atomic.os, "link", no_links)
    assert create_exclusive(tmp_path / "a", b"mine") is True
    assert create_exclusive(tmp_path / "a", b"theirs") is False
    assert (tmp_path / "a").read_bytes() == b"mine"
    real_write = os.write
    calls = [0]

    def fails_on_the_second_file(fd: int, data: bytes) -> int:
        calls[0] += 1
        if calls[0] == 2:  # the first is the temporary file, the second the record itself
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(_atomic.os, "write", fails_on_the_second_file)
    with pytest.raises(OSError, match="No space left"):
        create_exclusive(tmp_path / "b", b"mine")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_a_link_that_succeeded_but_answered_eexist_counts_as_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NFS may answer a retried `link` with EEXIST although the first try made it: the
    temporary file then has two names."""
    real_link = os.link

    def retried(src: str, dst: str) -> None:
        real_link(src, dst)
        raise FileExistsError(errno.EEXIST, "File exists")

    monkeypatch.setattr(_atomic.os, "link", retried)
    assert create_exclusive(tmp_path / "c", b"mine") is True
    monkeypatch.undo()
    assert create_exclusive(tmp_path / "c", b"theirs") is False
    assert (tmp_path / "c").read_bytes() == b"mine"


def test_the_lock_refuses_a_second_holder_and_names_the_first(tmp_path: Path) -> None:
    first, second = ExclusiveLock(tmp_path / ".lock"), ExclusiveLock(tmp_path / ".lock")
    assert first.acquire() and first.held and not first.soft
    assert second.acquire() is False and not second.held
    assert f"pid={os.getpid()}" in second.describe_owner()
    first.release()
    assert second.acquire()
    second.release()
