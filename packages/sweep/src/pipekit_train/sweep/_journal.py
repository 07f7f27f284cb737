"""The sweep journal: one fsync'd JSON line per finished trial, so a killed sweep resumes.

Layout of a sweep directory:

```
<directory>/
  sweep.json        sweep id, trial function, metric and mode (checked on resume)
  journal.jsonl     append-only, one line per finished trial (ok, failed or pruned)
  .lock             held while a sweep runs in this directory (`_lock.sweep_dir_lock`)
  trials/<key>/     each trial's own folder (its `trial_dir`)
  optuna.db         the default Optuna storage of an `OptunaSearch`
```

Every line is written whole with one `write`, flushed and fsync'd before the sweep moves
on. A line torn by a kill (the last one, without its newline or not valid JSON) is
ignored and cut off before the next append. Later lines for the same trial win.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["Journal", "decode_floats", "encode_floats", "params_key"]

_VERSION = 1


def params_key(params: Mapping[str, Any]) -> str:
    """A stable 16-hex-digit hash of a parameter set (canonical JSON, sorted keys)."""
    text = json.dumps(params, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def encode_floats(value: Any) -> Any:
    """Replace non-finite floats by the strings `"nan"`, `"inf"`, `"-inf"` (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, Mapping):
        return {k: encode_floats(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode_floats(v) for v in value]
    return value


_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def decode_floats(
    value: Any, *, keys: tuple[str, ...] = ("value", "final_metrics", "best_metric")
) -> Any:
    """Inverse of `encode_floats` for the numeric fields of a journal record."""

    def fix(v: Any) -> Any:
        if isinstance(v, str) and v in _NONFINITE:
            return _NONFINITE[v]
        if isinstance(v, Mapping):
            return {k: fix(x) for k, x in v.items()}
        return v

    if isinstance(value, Mapping):
        return {k: (fix(v) if k in keys else decode_floats(v, keys=keys)) for k, v in value.items()}
    return value


class Journal:
    """The append-only record of a sweep's finished trials (`<directory>/journal.jsonl`).

    Args:
        path: the journal file.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    def read(self) -> list[dict[str, Any]]:
        """Every complete record, in file order (a torn last line is skipped)."""
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        records = []
        lines = data.split(b"\n")
        complete, tail = lines[:-1], lines[-1]
        for number, line in enumerate(complete, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                warnings.warn(
                    f"Skipping an unreadable line {number} of the sweep journal {self.path}.",
                    RuntimeWarning,
                    stacklevel=2,
                )
                continue
            if isinstance(record, dict) and "key" in record:
                records.append(decode_floats(record))
        if tail.strip():
            # A last line without its newline was torn by a kill: its trial did not finish.
            try:
                json.loads(tail)
            except ValueError:
                pass
            else:
                warnings.warn(
                    f"The last line of the sweep journal {self.path} has no newline; "
                    "treating it as torn (its trial will run again).",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return records

    def repair(self) -> None:
        """Cut a torn last line off, so the next append starts on a fresh line."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if not data or data.endswith(b"\n"):
            return
        keep = data.rfind(b"\n") + 1
        with open(self.path, "r+b") as fh:
            fh.truncate(keep)
            fh.flush()
            os.fsync(fh.fileno())

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one record as a line, flush and fsync it."""
        line = json.dumps(
            {"v": _VERSION, **encode_floats(dict(record))}, sort_keys=True, allow_nan=False
        )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
