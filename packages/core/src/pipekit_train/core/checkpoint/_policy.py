"""The checkpoint policy: what to save, when, and what to keep."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from math import isfinite
from pathlib import Path
from typing import Any, Literal

from pipekit_train.core._checks import positive_int
from pipekit_train.core._errors import ConfigError

from ._location import Location, check_lease_store, parse_location

__all__ = ["Checkpoint"]

_RESUME = ("auto", "never", "must")


def _check_local_directory(local: str, text: str) -> None:
    """Refuse a local path that is an existing file."""
    path = Path(local).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(
            "`Checkpoint.directory` must be a directory, but that path is an existing file. "
            f"Received: directory={text!r}. Choose a new or existing folder instead."
        )


@dataclass(frozen=True)
class Checkpoint:
    """Checkpoint policy shared by every backend.

    Each adapter saves with its backend's engine (Orbax for Equinox, an atomic directory
    store for Lightning, Keras and the numpy reference); every checkpoint holds the model,
    the optimizer state, the step, the RNG state, the data iterator state and the run's
    callback/history state, so a resumed run continues exactly.

    Args:
        directory: where checkpoints live: a local folder (created at the first save), or
            any fsspec URI (`s3://bucket/run`, `gs://bucket/run`, `memory://run`;
            `file://` URIs are local folders). A URI whose protocol fsspec does not know,
            or whose implementation is not installed (s3fs, gcsfs, ...), is refused with a
            `ConfigError`, and so is a path that is an existing file. On a URI each step
            is committed by a marker written last (object stores have no atomic rename);
            see the checkpoints guide.
        every_n_steps: save after every `every_n_steps` optimizer steps (and at the end).
        max_to_keep: keep the `max_to_keep` most recent checkpoints (None keeps all).
        keep_best: additionally keep the `keep_best` best checkpoints by `monitor`.
        monitor: the metric `keep_best` ranks by (e.g. `"val_loss"`).
        mode: `"min"` or `"max"`: whether a smaller or larger `monitor` is better.
        async_save: write in the background when the backend supports it.
        resume: `"auto"` resumes from the latest complete checkpoint if there is one;
            `"never"` requires an empty directory; `"must"` fails if there is none.
        save_on_end: also save after the last step.
        every_n_minutes: also save when this many minutes of wall-clock time have passed
            since the run began or the last save (beside `every_n_steps`; None: off).
            Multi-process runs agree on it, so every process saves the same step.
        storage_options: fsspec options for a URI location, as for the model registry:
            e.g. `{"key": ..., "secret": ..., "client_kwargs": {"endpoint_url": ...}}`
            for s3fs. None uses the filesystem's defaults (environment credentials).
            Never written into a checkpoint, the plan or the artifact.
        lease_timeout: one run per location: the run holds a lease on the location
            (records under `.pipekit-lease/`, renewed every `lease_timeout / 8` s, at most
            15 s) and a second run on it is refused at once. A holder whose heartbeat is
            older than `lease_timeout` seconds is taken over from any host; a holder whose
            process provably ended on this host (same boot and pid namespace), and an
            earlier restart of the same scheduler job and step, are taken over at once
            (the rules: the checkpoints guide). A URI whose store cannot create a file
            conditionally (S3, GCS and memory can) is refused. None: no lease (the
            location's user guarantees a single writer).
    """

    directory: str | os.PathLike[str]
    every_n_steps: int = 1000
    max_to_keep: int | None = 3
    keep_best: int | None = None
    monitor: str = "val_loss"
    mode: Literal["min", "max"] = "min"
    async_save: bool = True
    resume: Literal["auto", "never", "must"] = "auto"
    save_on_end: bool = True
    storage_options: Mapping[str, Any] | None = field(default=None, repr=False, hash=False)
    every_n_minutes: float | None = None
    lease_timeout: float | None = 120.0

    def __post_init__(self) -> None:
        if not isinstance(self.directory, (str, os.PathLike)) or not str(self.directory):
            raise ConfigError(
                "`Checkpoint.directory` must be a non-empty path. "
                f"Received: directory={self.directory!r}."
            )
        location = parse_location(self.directory, self.storage_options)
        if location.local is not None:
            _check_local_directory(location.local, os.fsdecode(os.fspath(self.directory)))
        if self.storage_options is not None:
            object.__setattr__(self, "storage_options", dict(self.storage_options))
        positive_int("every_n_steps", self.every_n_steps, field="Checkpoint.every_n_steps")
        positive_int(
            "max_to_keep", self.max_to_keep, allow_none=True, field="Checkpoint.max_to_keep"
        )
        minutes = self.every_n_minutes
        if minutes is not None and (
            isinstance(minutes, bool)
            or not isinstance(minutes, (int, float))
            or not 0 < minutes < float("inf")
        ):
            raise ConfigError(
                "`Checkpoint.every_n_minutes` must be a positive number of minutes or None. "
                f"Received: every_n_minutes={minutes!r}. Use e.g. every_n_minutes=30."
            )
        timeout = self.lease_timeout
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not 0 < timeout < float("inf")
        ):
            raise ConfigError(
                "`Checkpoint.lease_timeout` must be a positive number of seconds or None. "
                f"Received: lease_timeout={timeout!r}. Use e.g. lease_timeout=120, or None "
                "to run without a lease."
            )
        check_lease_store(location, timeout)
        positive_int("keep_best", self.keep_best, allow_none=True, field="Checkpoint.keep_best")
        if self.mode not in ("min", "max"):
            raise ConfigError(
                f"`Checkpoint.mode` must be 'min' or 'max'. Received: mode={self.mode!r}."
            )
        if self.resume not in _RESUME:
            raise ConfigError(
                f"`Checkpoint.resume` must be one of {list(_RESUME)}. Received: resume={self.resume!r}."
            )
        if not isinstance(self.monitor, str) or not self.monitor:
            raise ConfigError(
                f"`Checkpoint.monitor` must be a metric name. Received: monitor={self.monitor!r}."
            )

    def _location(self) -> Location:
        return parse_location(self.directory, self.storage_options)

    @property
    def is_remote(self) -> bool:
        """Whether the checkpoints live at a URI (not in a local folder)."""
        return self._location().uri is not None

    @property
    def path(self) -> Path:
        """The local checkpoint directory as an absolute `Path`.

        Raises:
            ValueError: the location is a URI (use `location`).
        """
        location = self._location()
        if location.local is None:
            raise ValueError(
                f"Checkpoint.path is a local folder, but the checkpoints live at {location.uri}. "
                "Use Checkpoint.location (a string) or Checkpoint.filesystem()."
            )
        return Path(location.local).expanduser().absolute()

    @property
    def location(self) -> str:
        """Where checkpoints live: the absolute local path, or the URI (`s3://bucket/run`)."""
        uri = self._location().uri
        return uri if uri is not None else str(self.path)

    def step_location(self, step: int) -> str:
        """Where step `step` is (or would be) saved: a local path or a URI."""
        uri = self._location().uri
        return f"{uri}/{int(step)}" if uri is not None else str(self.path / str(int(step)))

    def filesystem(self) -> tuple[Any, str]:
        """`(fsspec filesystem, root path on it)` of the location, with `storage_options`."""
        location = self._location()
        if location.uri is None:
            from fsspec.implementations.local import LocalFileSystem

            return LocalFileSystem(), str(self.path)
        import fsspec.core

        fs, root = fsspec.core.url_to_fs(location.uri, **dict(self.storage_options or {}))
        return fs, root.rstrip("/")

    def due(self, step: int, *, final: bool = False) -> bool:
        """Whether a checkpoint is due after `step` completed steps."""
        if step <= 0:
            return False
        return step % self.every_n_steps == 0 or (final and self.save_on_end)

    def retained(self, steps: Iterable[int], scores: Mapping[int, float | None]) -> set[int]:
        """The steps to keep: the `max_to_keep` latest plus the `keep_best` best by `monitor`.

        A step's score is the latest value of `monitor` when it was saved, so the steps
        saved after a validation and before the next one carry that validation's value:
        among equal scores the earliest step ranks first (the one that measured it, the
        step `artifact.best_step` names). Steps without a finite score are not ranked.
        """
        ordered = sorted(set(steps))
        keep = set(ordered if self.max_to_keep is None else ordered[-self.max_to_keep :])
        if self.keep_best:
            scored = [
                (s, float(v)) for s in ordered if (v := scores.get(s)) is not None and isfinite(v)
            ]
            sign = 1.0 if self.mode == "min" else -1.0
            scored.sort(key=lambda item: (sign * item[1], item[0]))
            keep.update(s for s, _ in scored[: self.keep_best])
        return keep
