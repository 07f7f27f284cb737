"""The error hierarchy of pipekit-train.

Every error raised on purpose by pipekit-train derives from `PipekitError`, so a
caller can catch the library's errors without catching unrelated ones. Messages
follow one style: name the field in backticks, echo `Received: field=value`, and
say how to fix it.
"""

from __future__ import annotations

__all__ = ["CheckpointError", "ConfigError", "IntegrityError", "PipekitError"]


class PipekitError(Exception):
    """Base class of every error pipekit-train raises on purpose."""


class ConfigError(PipekitError, ValueError):
    """Invalid user input: a field has a value that cannot work.

    Raised before any work is done, so nothing partial is left on disk.
    """


class IntegrityError(PipekitError):
    """Stored bytes do not match their recorded SHA-256 (a tampered or damaged blob)."""


class CheckpointError(PipekitError):
    """A checkpoint cannot be written or restored (for example `resume="must"` with none)."""
