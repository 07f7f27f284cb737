"""Errors in CLI terms: the fixes core words for Python callers, re-worded for the CLI.

Core's errors name Python (`Checkpoint(resume='never')`, `TrainingLoop(...)`); a CLI user
fixes a run with a flag, a `--set` or a TOML key. The CLI catches what it passes on and
re-words the fix here, keeping the exception's type (and the original as its cause).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["in_cli_terms"]

E = TypeVar("E", bound=BaseException)

_DIFFERENT_PLAN = "Use a new checkpoint directory, or Checkpoint(resume='never') with an empty one."


def _different_plan(message: str, directory: str) -> str:
    return message.replace(
        _DIFFERENT_PLAN,
        "Train into a new checkpoint directory (--set checkpoint.directory=<new folder>), or "
        f"empty {directory} and run with --set checkpoint.resume=never to start over.",
    )


def _resume_never(message: str, directory: str) -> str:
    if "`Checkpoint.resume='never'` but" not in message:
        return message
    message = message.replace(
        "`Checkpoint.resume='never'` but", '`checkpoint.resume = "never"` but'
    ).replace(
        "Received: resume='never', directory=",
        "Received: checkpoint.resume='never', checkpoint.directory=",
    )
    return re.sub(
        r"Use resume='auto' to continue from them, or an empty directory\.",
        "Use --set checkpoint.resume=auto to continue from them, or a new "
        "checkpoint.directory (--set checkpoint.directory=<new folder>).",
        message,
    )


def _accumulation(message: str, directory: str) -> str:
    return message.replace(
        "Use TrainingLoop(accumulate_grad_batches=k):",
        "Set the top-level key accumulate_grad_batches = k (or --set accumulate_grad_batches=k):",
    )


_REWORDINGS: tuple[Callable[[str, str], str], ...] = (
    _different_plan,
    _resume_never,
    _accumulation,
)


def in_cli_terms(exc: E, config: Any = None) -> E:
    """`exc` with its fix re-worded in CLI terms (the same object when nothing changes).

    Args:
        exc: a pipekit-train error raised while building or running a config's loop.
        config: the `RunConfig` (its checkpoint directory is named in the fixes).
    """
    message = str(exc)
    checkpoint = getattr(config, "checkpoint", None)
    directory = "the checkpoint directory" if checkpoint is None else str(checkpoint.location)
    worded = message
    for reword in _REWORDINGS:
        worded = reword(worded, directory)
    if worded == message:
        return exc
    try:
        out = type(exc)(worded)
    except TypeError:  # an error class with other constructor arguments: leave it be
        return exc
    out.__cause__ = exc
    return out
