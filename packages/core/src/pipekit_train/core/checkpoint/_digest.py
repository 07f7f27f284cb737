"""Content digests of checkpoint step folders (Orbax steps, whatever writes them).

`seal_folder(folder, step)` writes `pipekit-digest.json` into a committed step directory: the
SHA-256 and size of every other file under it. It is written last and atomically (a
temporary file renamed into place), so a step without it was never sealed: the process
stopped between Orbax's commit and the digest. `check_folder(folder)` returns what is wrong
with a step (`None` when every file matches its digest and no file was added).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pipekit_train.core._atomic import write_atomic

__all__ = ["FOLDER_DIGEST", "check_folder", "seal_folder", "sha256_file"]

FOLDER_DIGEST = "pipekit-digest.json"
# the digest's temporary files while it is written (`write_atomic`; an older version's)
_TMP = (f".tmp-{FOLDER_DIGEST}.", f".{FOLDER_DIGEST}.tmp-")
_FORMAT = 1
_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _files(folder: Path) -> dict[str, Path]:
    """Every file under `folder` but the digest (and its temporary files), by POSIX path."""
    out: dict[str, Path] = {}
    for path in folder.rglob("*"):
        if path.name == FOLDER_DIGEST or path.name.startswith(_TMP) or not path.is_file():
            continue
        out[path.relative_to(folder).as_posix()] = path
    return out


def seal_folder(folder: Path, step: int, *, generation: int | None = None) -> None:
    """Hash every file of the committed step `folder` and write its digest atomically.

    Args:
        folder: the step's folder.
        step: its step.
        generation: the run lease generation that wrote it (see `_fencing`), if any.
    """
    files = {
        name: {"sha256": sha256_file(path), "size": path.stat().st_size}
        for name, path in sorted(_files(folder).items())
    }
    record: dict[str, Any] = {"format": _FORMAT, "step": int(step), "files": files}
    if generation is not None:
        record["generation"] = int(generation)
    write_atomic(folder / FOLDER_DIGEST, json.dumps(record, sort_keys=True, indent=1).encode())


def check_folder(folder: Path) -> str | None:
    """What is wrong with step `folder` against its digest, or `None` if it is intact."""
    try:
        record = json.loads((folder / FOLDER_DIGEST).read_text())
        files = record["files"]
        if not isinstance(files, dict) or not files:
            raise ValueError("no files")
    except FileNotFoundError:
        return f"it has no {FOLDER_DIGEST} (the save was interrupted before it was sealed)"
    except (OSError, ValueError, KeyError, TypeError):
        return f"its {FOLDER_DIGEST} is unreadable or damaged"
    on_disk = _files(folder)
    for name, info in sorted(files.items()):
        path = on_disk.pop(name, None)
        if path is None:
            return f"{name} is missing"
        try:
            size = path.stat().st_size
            if not isinstance(info, dict) or size != info.get("size"):
                return f"{name} does not match its digest (size)"
            if sha256_file(path) != info.get("sha256"):
                return f"{name} does not match its SHA-256 digest"
        except OSError as exc:
            return f"{name} is unreadable ({type(exc).__name__})"
    if on_disk:
        return f"{sorted(on_disk)[0]} is not in its {FOLDER_DIGEST}"
    return None
