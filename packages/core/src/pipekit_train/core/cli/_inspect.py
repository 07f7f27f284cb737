"""`pipekit-train checkpoint inspect DIR`: what a checkpoint folder holds, verified.

Two layouts are read, without importing a backend:

- the directory store (Lightning, Keras, the numpy reference, online trainers):
  `<dir>/<step>/{<blobs>, meta.json, MANIFEST.json}`; a step is complete when its
  `MANIFEST.json` exists and every file it lists matches its SHA-256.
- Orbax (Equinox): `<dir>/<step>/{state/, meta/metadata, pipekit/metadata,
  pipekit-digest.json}`; a step is complete when its `pipekit-digest.json` exists, every
  file it lists matches its SHA-256, and no other file was added (the rule the Equinox
  adapter applies before restoring).

A step that is not complete is *torn*: a resumed run skips it. So is a *void* step: one
that a run wrote after it had lost the location's lease (see the checkpoints guide). Folders of interrupted
writes (`.tmp-*`, `<step>.orbax-checkpoint-tmp-*`) are listed too.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.checkpoint._digest import FOLDER_DIGEST, check_folder, sha256_file
from pipekit_train.core.checkpoint._engine import MANIFEST, META
from pipekit_train.core.checkpoint._lease import read_lease
from pipekit_train.core.checkpoint._policy import Checkpoint
from pipekit_train.core.checkpoint._store import LocalStore
from pipekit_train.core.spec._plan import RESUME_KEY_FIELDS

__all__ = ["checkpoint_inspect", "inspect_checkpoints"]

DIGEST = FOLDER_DIGEST


def _check_files(folder: Path, listed: dict[str, Any]) -> str | None:
    for name, info in sorted(listed.items()):
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if not isinstance(info, dict):
            return f"the entry of {name} is damaged"
        size = info.get("size")
        if size is not None and path.stat().st_size != size:
            return f"{name} does not match its recorded size"
        if sha256_file(path) != info.get("sha256"):
            return f"{name} does not match its SHA-256"
    return None


def _directory_step(folder: Path) -> tuple[str | None, dict[str, Any] | None, dict[str, Any]]:
    """(problem, meta, manifest) of a directory-store step."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = manifest["files"]
        if not isinstance(files, dict):
            raise ValueError
    except FileNotFoundError:
        return f"no {MANIFEST} (an interrupted write)", None, {}
    except (OSError, ValueError, KeyError, TypeError):
        return f"its {MANIFEST} is unreadable or damaged", None, {}
    problem = _check_files(folder, files)
    if problem is not None:
        return problem, None, manifest
    meta = json.loads((folder / META).read_text()) if META in files else {}
    return None, meta, manifest


def _orbax_step(folder: Path) -> tuple[str | None, dict[str, Any] | None, dict[str, Any]]:
    """(problem, meta, pipekit record) of an Orbax step sealed by the Equinox adapter."""
    problem = check_folder(folder)
    if problem is not None:
        return problem, None, {}
    try:
        meta = json.loads((folder / "meta" / "metadata").read_text())
        record = json.loads((folder / "pipekit" / "metadata").read_text())
    except (OSError, ValueError) as exc:
        return f"its metadata is unreadable ({type(exc).__name__})", None, {}
    return None, meta, record


def _engine(folder: Path) -> str:
    orbax = ("_CHECKPOINT_METADATA", DIGEST, "state", "pipekit")
    return "orbax" if any((folder / name).exists() for name in orbax) else "directory"


def _size(folder: Path) -> tuple[int, int]:
    files = [p for p in folder.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def _summary(meta: dict[str, Any]) -> dict[str, Any]:
    run = meta.get("run") or {}
    return {
        "epoch": meta.get("epoch"),
        "metrics": run.get("latest") or {},
        "best_metric": run.get("best_metric"),
        "best_step": run.get("best_step"),
        "resume_key": ordered_resume_key(meta.get("resume_key") or {}),
        "data_iter": meta.get("data_iter"),
    }


def inspect_checkpoints(directory: str | Path) -> dict[str, Any]:
    """A JSON report of every step under `directory`: complete or torn (and why), metadata.

    Raises:
        ConfigError: `directory` is not a folder.
    """
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise ConfigError(
            f"There is no checkpoint folder at {str(directory)!r}. Received: "
            f"directory={str(directory)!r}. Pass the folder given as checkpoint.directory."
        )
    steps = []
    store = LocalStore(Checkpoint(root, lease_timeout=None))
    for step in sorted(int(p.name) for p in root.iterdir() if p.is_dir() and p.name.isdigit()):
        folder = root / str(step)
        engine = _engine(folder)
        problem, meta, record = (_orbax_step if engine == "orbax" else _directory_step)(folder)
        void = store.void_reason(step)
        if problem is None and void is not None:
            problem = f"void: {void}"
        files, size = _size(folder)
        entry: dict[str, Any] = {
            "step": step,
            "engine": engine,
            "complete": problem is None,
            "problem": problem,
            "files": files,
            "bytes": size,
            "score": record.get("score"),
        }
        if meta is not None:
            entry.update(_summary(meta))
            if meta.get("step") not in (None, step):
                entry.update(complete=False, problem=f"its metadata says step {meta['step']}")
        steps.append(entry)
    pending = sorted(
        p.name
        for p in root.iterdir()
        if p.name.startswith((".tmp-", ".trash-")) or ".orbax-checkpoint-tmp" in p.name
    )
    complete = [s["step"] for s in steps if s["complete"]]
    holder = read_lease(Checkpoint(root, lease_timeout=None))
    return {
        "held_by": None if holder is None else holder.describe(),
        "directory": str(root.resolve()),
        "steps": steps,
        "latest_complete": complete[-1] if complete else None,
        "interrupted_writes": pending,
    }


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _model(config: Any) -> str:
    if not isinstance(config, dict):
        return str(config)
    kwargs = ", ".join(f"{k}={v}" for k, v in sorted((config.get("kwargs") or {}).items()))
    return f"{config.get('factory', config.get('type'))}({kwargs}) seed={config.get('seed')}"


def ordered_resume_key(key: Mapping[str, Any]) -> dict[str, Any]:
    """A saved resume key in `Plan.resume_key`'s order (then any other field, sorted).

    Engines store the metadata JSON with or without sorted keys; the report does not
    depend on which.
    """
    known = [k for k in RESUME_KEY_FIELDS if k in key]
    return {k: key[k] for k in (*known, *sorted(set(key) - set(known)))}


def _resume_key(key: dict[str, Any]) -> list[str]:
    lines = []
    for name, value in ordered_resume_key(key).items():
        if name == "model":
            text = _model(value)
        elif isinstance(value, dict) and set(value) == {"name"}:
            text = str(value["name"])
        elif isinstance(value, dict):
            text = json.dumps({k: v for k, v in value.items() if v is not None}, sort_keys=True)
        else:
            text = str(value)
        lines.append(f"    {name}: {text}")
    return lines


def checkpoint_inspect(directory: str, *, as_json: bool = False, out: IO[str] | None = None) -> int:
    """Print the report of `inspect_checkpoints`; exit status 1 when no step is complete."""
    out = out or sys.stdout
    report = inspect_checkpoints(directory)
    if as_json:
        print(json.dumps(report, indent=2), file=out)
        return 0 if report["latest_complete"] is not None else 1
    steps = report["steps"]
    print(f"{report['directory']}: {len(steps)} step folder(s)", file=out)
    for s in steps:
        status = "complete" if s["complete"] else f"TORN: {s['problem']}"
        metrics = " ".join(f"{k}={v:.4g}" for k, v in sorted((s.get("metrics") or {}).items()))
        epoch = f" epoch={s['epoch']}" if s.get("epoch") is not None else ""
        print(
            f"  step {s['step']:>8}  {s['engine']:<9}  {status}  "
            f"({s['files']} files, {_bytes(s['bytes'])}){epoch}  {metrics}".rstrip(),
            file=out,
        )
    if report["held_by"] is not None:
        print(f"  held by a run: {report['held_by']}", file=out)
    for name in report["interrupted_writes"]:
        print(f"  interrupted write: {name} (cleaned up by the next run)", file=out)
    latest = report["latest_complete"]
    if latest is None:
        print(
            'no complete checkpoint: `pipekit-train run` (checkpoint.resume = "auto", the '
            "default) starts from step 0",
            file=out,
        )
        return 1
    entry = next(s for s in steps if s["step"] == latest)
    print(
        f"latest complete: step {latest} (`pipekit-train run` with checkpoint.resume = "
        '"auto", the default, continues from here)',
        file=out,
    )
    if entry.get("best_metric") is not None:
        print(f"  best: {entry['best_metric']:.6g} at step {entry['best_step']}", file=out)
    if entry.get("resume_key"):
        print("  resume key (must match the plan to resume):", file=out)
        for line in _resume_key(entry["resume_key"]):
            print(line, file=out)
    return 0
