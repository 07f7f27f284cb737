"""The checkpoint policy: what to save, when, and what to keep."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ._errors import ConfigError

__all__ = ["Checkpoint"]

_RESUME = ("auto", "never", "must")

# `scheme://...` (an RFC 3986 scheme of two or more characters), and `scheme:/...`, which
# is what `Path("s3://bucket/run")` turns it into. A Windows drive (`C:/runs`) does not match.
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/")


def _check_local_directory(directory: str | os.PathLike[str]) -> None:
    """Refuse a URI location (never a local path) and a path that is an existing file."""
    text = os.fspath(directory)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    match = _URI.match(text)
    if match:
        scheme = match.group(1)
        hint = (
            f" Use the local path {'/' + text[len(scheme) + 1 :].lstrip('/')!r}."
            if scheme.lower() == "file"
            else " Use a local directory (e.g. on a mounted disk) and copy it to object storage yourself."
        )
        raise ConfigError(
            "`Checkpoint.directory` must be a local directory: checkpoints to a URI "
            f"({scheme}://) are not supported yet. Received: directory={text!r}.{hint}"
        )
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(
            "`Checkpoint.directory` must be a directory, but that path is an existing file. "
            f"Received: directory={text!r}. Choose a new or existing folder instead."
        )


def _positive_int(name: str, value: object, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        suffix = " or None" if allow_none else ""
        raise ConfigError(
            f"`Checkpoint.{name}` must be a positive int{suffix}. Received: {name}={value!r}."
        )


@dataclass(frozen=True)
class Checkpoint:
    """Checkpoint policy shared by every backend.

    Each adapter saves with its backend's engine (Orbax for Equinox, an atomic directory
    store for Lightning, Keras and the numpy reference); every checkpoint holds the model,
    the optimizer state, the step, the RNG state, the data iterator state and the run's
    callback/history state, so a resumed run continues exactly.

    Args:
        directory: where checkpoints live: a local folder, created at the first save. A
            URI (`s3://...`, `gs://...`, `memory://...`, `file://...`) is refused with a
            `ConfigError` (cloud checkpoints are not supported yet), and so is a path that
            is an existing file.
        every_n_steps: save after every `every_n_steps` optimizer steps (and at the end).
        max_to_keep: keep the `max_to_keep` most recent checkpoints (None keeps all).
        keep_best: additionally keep the `keep_best` best checkpoints by `monitor`.
        monitor: the metric `keep_best` ranks by (e.g. `"val_loss"`).
        mode: `"min"` or `"max"`: whether a smaller or larger `monitor` is better.
        async_save: write in the background when the backend supports it.
        resume: `"auto"` resumes from the latest complete checkpoint if there is one;
            `"never"` requires an empty directory; `"must"` fails if there is none.
        save_on_end: also save after the last step.
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

    def __post_init__(self) -> None:
        if not isinstance(self.directory, (str, os.PathLike)) or not str(self.directory):
            raise ConfigError(
                "`Checkpoint.directory` must be a non-empty path. "
                f"Received: directory={self.directory!r}."
            )
        _check_local_directory(self.directory)
        _positive_int("every_n_steps", self.every_n_steps)
        _positive_int("max_to_keep", self.max_to_keep, allow_none=True)
        _positive_int("keep_best", self.keep_best, allow_none=True)
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

    @property
    def path(self) -> Path:
        """The checkpoint directory as an absolute `Path`."""
        return Path(os.fspath(self.directory)).expanduser().absolute()

    def due(self, step: int, *, final: bool = False) -> bool:
        """Whether a checkpoint is due after `step` completed steps."""
        if step <= 0:
            return False
        return step % self.every_n_steps == 0 or (final and self.save_on_end)

    def retained(self, steps: Iterable[int], scores: Mapping[int, float | None]) -> set[int]:
        """The steps to keep: the `max_to_keep` latest plus the `keep_best` best by `monitor`."""
        ordered = sorted(set(steps))
        keep = set(ordered if self.max_to_keep is None else ordered[-self.max_to_keep :])
        if self.keep_best:
            scored = [(s, scores[s]) for s in ordered if scores.get(s) is not None]
            sign = 1.0 if self.mode == "min" else -1.0
            scored.sort(key=lambda item: (sign * float(item[1]), -item[0]))  # type: ignore[arg-type]
            keep.update(s for s, _ in scored[: self.keep_best])
        return keep
