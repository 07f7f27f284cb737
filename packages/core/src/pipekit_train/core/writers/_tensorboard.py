"""`TensorBoardWriter`: scalars in TensorBoard event files, without TensorFlow."""

from __future__ import annotations

import itertools
import os
import socket
import time
from collections.abc import Mapping

from pipekit_train.core._errors import ConfigError
from pipekit_train.core._imports import optional_import

__all__ = ["TensorBoardWriter"]

_FILE_COUNTER = itertools.count()


class TensorBoardWriter:
    """Write each metric as a TensorBoard scalar (`simple_value`, float32) at its step.

    The event file is written with the `tensorboard` package's own record writer
    (`tensorboard.summary.writer.record_writer.RecordWriter`, the TFRecord framing with
    masked CRC32C) and its `Event` / `Summary` protocol buffers. The file is opened
    through fsspec, so `logdir` may be a local folder or any fsspec URI; TensorBoard
    itself reads local folders (and whatever its own filesystem layer supports). On
    object stores the file appears when the writer is closed.

    `tensorboard.summary.writer.event_file_writer.EventFileWriter` is deliberately not
    used: it goes through `tensorboard.compat.tf`, which imports TensorFlow when it is
    installed, and core never imports TensorFlow.

    Each writer creates a new event file
    (`events.out.tfevents.<time>.<host>.<pid>.<n><filename_suffix>`); TensorBoard merges
    the files of a folder, so a resumed run simply adds one.

    Args:
        logdir: the run's log folder (created when missing).
        filename_suffix: appended to the event file name.

    Raises:
        ImportError: tensorboard is not installed (install the `tensorboard` extra).
        ConfigError: `logdir` is not a path.
    """

    def __init__(self, logdir: str | os.PathLike[str], *, filename_suffix: str = ""):
        optional_import("tensorboard", extra="tensorboard", package="pipekit-train-core")
        import fsspec
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        if isinstance(logdir, os.PathLike):
            logdir = os.fspath(logdir)
        if not isinstance(logdir, str) or not logdir:
            raise ConfigError(
                f"`logdir` must be a folder path or an fsspec URI. Received: logdir={logdir!r}. "
                "Pass e.g. 'runs/exp1'."
            )
        self.logdir = logdir
        self._event_pb2 = event_pb2
        self._summary_pb2 = summary_pb2
        fs, path = fsspec.core.url_to_fs(logdir)
        fs.makedirs(path, exist_ok=True)
        name = (
            f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
            f"{os.getpid()}.{next(_FILE_COUNTER)}{filename_suffix}"
        )
        self.path = f"{path.rstrip('/')}/{name}"
        self._writer = RecordWriter(fs.open(self.path, "wb"))
        self._closed = False
        first = event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")
        first.source_metadata.writer = "pipekit_train.core.writers.TensorBoardWriter"
        self._writer.write(first.SerializeToString())
        self._writer.flush()

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        """Write one event holding every metric as a scalar at `step`."""
        if self._closed:
            raise RuntimeError(f"TensorBoardWriter({self.logdir!r}) is closed.")
        summary = self._summary_pb2.Summary(
            value=[
                self._summary_pb2.Summary.Value(tag=str(k), simple_value=float(v))
                for k, v in metrics.items()
            ]
        )
        event = self._event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary)
        self._writer.write(event.SerializeToString())

    def flush(self) -> None:
        """Flush the event file."""
        if not self._closed:
            self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        if not self._closed:
            self._closed = True
            self._writer.close()

    def __repr__(self) -> str:
        return f"TensorBoardWriter({self.logdir!r})"

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # best effort at interpreter shutdown
            pass
