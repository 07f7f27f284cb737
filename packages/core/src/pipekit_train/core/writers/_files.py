"""`JsonlWriter` and `CsvWriter`: metrics as text files on any fsspec URI.

Both buffer records in memory and append them to the file on `flush()` (and every
`flush_every` records, and on `close()`), opening the file only for that moment: the
data is visible after each flush on every filesystem, including object stores
(`s3://`, `gs://`) and `memory://`. An existing file is appended to, so a resumed run
continues the same log; steps logged after the last checkpoint of the interrupted run
then appear twice (keep the last record of a step when reading).

Non-finite values are written as Python writes them (`NaN`, `Infinity` in JSON lines;
`nan`, `inf` in CSV); `json.loads`, `float()` and pandas read them back.
"""

from __future__ import annotations

import csv
import io
import json
import numbers
import os
from collections.abc import Mapping
from typing import Any

from pipekit_train.core._errors import ConfigError

__all__ = ["CsvWriter", "JsonlWriter"]


def _check_uri(uri: Any) -> str:
    if isinstance(uri, os.PathLike):
        uri = os.fspath(uri)
    if not isinstance(uri, str) or not uri:
        raise ConfigError(
            f"`uri` must be a file path or an fsspec URI. Received: uri={uri!r}. "
            "Pass e.g. 'runs/metrics.jsonl' or 's3://bucket/run/metrics.jsonl'."
        )
    return uri


class _BufferedFileWriter:
    """Buffer records; append them to one file on flush."""

    def __init__(self, uri: str | os.PathLike[str], *, flush_every: int = 100) -> None:
        import fsspec

        if (
            isinstance(flush_every, bool)
            or not isinstance(flush_every, numbers.Integral)
            or flush_every < 1
        ):
            raise ConfigError(
                f"`flush_every` must be an integer >= 1. Received: flush_every={flush_every!r}. "
                "Pass e.g. flush_every=100."
            )
        self.uri: str = _check_uri(uri)
        self.flush_every: int = int(flush_every)
        fs, path = fsspec.core.url_to_fs(self.uri)
        self._fs: Any = fs
        self._path: str = path
        self._buffer: list[tuple[int, dict[str, float]]] = []
        self._closed: bool = False
        self._dir_made: bool = False

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        """Buffer one record; flush when `flush_every` records are pending.

        Raises:
            ConfigError: a metric is named `step` (the column reserved for the step).
            RuntimeError: the writer is closed.
        """
        if self._closed:
            raise RuntimeError(f"{type(self).__name__}({self.uri!r}) is closed.")
        if "step" in metrics:
            raise ConfigError(
                f"A metric may not be named 'step' in {type(self).__name__}: the name is the "
                f"step column. Received: metrics keys {sorted(metrics)}. Rename the metric."
            )
        self._add(int(step), {str(k): float(v) for k, v in metrics.items()})
        if len(self._buffer) >= self.flush_every:
            self.flush()

    def _add(self, step: int, metrics: dict[str, float]) -> None:
        self._buffer.append((step, metrics))

    def flush(self) -> None:
        """Append the pending records to the file."""
        if not self._buffer:
            return
        if not self._dir_made:
            parent = self._fs._parent(self._path)
            if parent:
                self._fs.makedirs(parent, exist_ok=True)
            self._dir_made = True
        records, self._buffer = self._buffer, []
        self._append(records)

    def _append(self, records: list[tuple[int, dict[str, float]]]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Flush; later writes raise."""
        if self._closed:
            return
        self.flush()
        self._closed = True

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


class JsonlWriter(_BufferedFileWriter):
    """One JSON object per `write`: `{"step": 10, "loss": 0.25, ...}` per line.

    Args:
        uri: a local path or any fsspec URI; parent folders are created.
        flush_every: append to the file after this many pending records.
    """

    def _append(self, records: list[tuple[int, dict[str, float]]]) -> None:
        text = "".join(json.dumps({"step": step, **metrics}) + "\n" for step, metrics in records)
        with self._fs.open(self._path, "ab") as f:
            f.write(text.encode("utf-8"))


class CsvWriter(_BufferedFileWriter):
    """A wide CSV: a `step` column, then one column per metric in first-seen order.

    Consecutive writes at the same step with disjoint metric names (training metrics
    then validation metrics) share one row while they are still buffered; other writes
    make one row each, with empty cells for metrics they lack. When a metric name
    appears that the file has no column for, the file is rewritten once with the wider
    header (earlier rows get empty cells); this is rare (new names appear in the first
    steps and at the first validation) and costs one read and write of the file.

    Args:
        uri: a local path or any fsspec URI; parent folders are created.
        flush_every: append to the file after this many pending rows.
    """

    def __init__(self, uri: str | os.PathLike[str], *, flush_every: int = 100) -> None:
        super().__init__(uri, flush_every=flush_every)
        self._columns: list[str] | None = None  # metric columns in the file, once known

    def _add(self, step: int, metrics: dict[str, float]) -> None:
        if self._buffer:
            last_step, last = self._buffer[-1]
            if last_step == step and not (last.keys() & metrics.keys()):
                last.update(metrics)
                return
        self._buffer.append((step, metrics))

    def _read_rows(self) -> tuple[list[str], list[dict[str, str]]]:
        with self._fs.open(self._path, "rb") as f:
            text = f.read().decode("utf-8")
        reader = csv.DictReader(io.StringIO(text))
        header = list(reader.fieldnames or [])
        return [c for c in header if c != "step"], list(reader)

    def _append(self, records: list[tuple[int, dict[str, float]]]) -> None:
        exists = self._fs.exists(self._path) and self._fs.size(self._path) > 0
        old_rows: list[dict[str, str]] | None = None
        if self._columns is None:
            self._columns = self._read_rows()[0] if exists else []
        new = list(dict.fromkeys(k for _, m in records for k in m if k not in self._columns))
        if new and exists:
            _, old_rows = self._read_rows()  # rewrite with the wider header
        columns = self._columns + new
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        if old_rows is not None or not exists:
            writer.writerow(["step", *columns])
            for row in old_rows or []:
                writer.writerow([row.get("step", ""), *(row.get(c) or "" for c in columns)])
        for step, metrics in records:
            writer.writerow([step, *(repr(metrics[c]) if c in metrics else "" for c in columns)])
        mode = "ab" if exists and old_rows is None else "wb"
        with self._fs.open(self._path, mode) as f:
            f.write(buf.getvalue().encode("utf-8"))
        self._columns = columns
