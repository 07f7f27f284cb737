"""Core's checks of monitored metric names and of `restore_best`, before any work.

A run watches metrics by name: `EarlyStopping(monitor=...)`, `ReduceLROnPlateau`,
`Checkpoint(monitor=...)` (what `keep_best` and `restore_best` rank by). A `val_` name
must be one the run's validation produces: `val_loss`, `val_<name>` of each of
`metrics=`, or a name a callback declares in `produces` (patterns allowed). When a part
of the run may add names core cannot know (a callback with `validation_metrics` or
`on_validation_end` that declares nothing, a backend's own validation loop over user
code), the name is checked at the first validation instead (`monitored_value`). Names
without `val_` are the backend's step metrics and are checked there too.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.checkpoint._policy import Checkpoint

if TYPE_CHECKING:
    from pipekit_train.core.contract._adapter import Adapter
    from pipekit_train.core.spec._plan import Plan

__all__ = ["check_monitors", "check_restore_best", "produced_validation_metrics"]

_VALIDATION_HOOKS = ("validation_metrics", "on_validation_end")


def check_restore_best(
    restore_best: Any, checkpoint: Checkpoint | None, callbacks: Sequence[Any]
) -> bool:
    """Whether the run ends with its best checkpoint's weights; refuse what cannot.

    On when `restore_best=True` or a callback asks (`EarlyStopping(restore_best=True)`).

    Raises:
        ConfigError: not a bool; no checkpoint, or one without `keep_best`; a monitor that
            is not a validation metric; a callback asking with another monitor or mode
            than the checkpoint's.
    """
    if not isinstance(restore_best, bool):
        raise ConfigError(
            f"`restore_best` must be True or False. Received: restore_best={restore_best!r}."
        )
    asking = [cb for cb in callbacks if getattr(cb, "restore_best", False) is True]
    if not restore_best and not asking:
        return False
    who = f"{type(asking[0]).__name__}(restore_best=True)" if asking else "restore_best=True"
    if checkpoint is None:
        raise ConfigError(
            f"{who} ends the run with the weights of its best checkpoint, but the run saves "
            "none. Received: checkpoint=None. Pass e.g. checkpoint=Checkpoint('ckpt', "
            "keep_best=1, monitor='val_loss')."
        )
    if not checkpoint.keep_best:
        raise ConfigError(
            f"{who} ends the run with the weights of its best checkpoint, but the checkpoint "
            "policy does not keep the best. Received: Checkpoint(keep_best=None). Pass "
            f"Checkpoint(..., keep_best=1, monitor={checkpoint.monitor!r})."
        )
    if not checkpoint.monitor.startswith("val_"):
        raise ConfigError(
            f"{who} restores the checkpoint with the best validation metric, but the "
            f"checkpoint ranks by a training metric. Received: Checkpoint(monitor="
            f"{checkpoint.monitor!r}). Use a validation metric, e.g. monitor='val_loss'."
        )
    for cb in asking:
        for key in ("monitor", "mode"):
            mine, theirs = getattr(cb, key, None), getattr(checkpoint, key)
            if mine != theirs:
                raise ConfigError(
                    f"{type(cb).__name__}(restore_best=True) restores the best checkpoint, "
                    f"which the checkpoint ranks by its own {key}. Received: "
                    f"{type(cb).__name__}({key}={mine!r}), Checkpoint({key}={theirs!r}). "
                    f"Give both the same {key}."
                )
    return True


def produced_validation_metrics(
    adapter: Adapter, plan: Plan
) -> tuple[frozenset[str], tuple[str, ...]] | None:
    """`(names, patterns)` of the `val_` metrics the run's validation can produce, or
    None when some part of the run may add names that cannot be known before it runs."""
    if plan.validation is None or adapter.reports_own_validation_metrics(plan):
        return None
    names = {"val_loss", *(k if k.startswith("val_") else f"val_{k}" for k in plan.metrics)}
    patterns: list[str] = []
    for cb in plan.callbacks:
        declared = getattr(cb, "produces", None)
        if declared is None:
            if any(callable(getattr(cb, hook, None)) for hook in _VALIDATION_HOOKS):
                return None  # a user callback's validation names are unknown
            continue
        if isinstance(declared, str) or not isinstance(declared, Sequence):
            raise ConfigError(
                f"`{type(cb).__name__}.produces` must be a tuple of metric names. "
                f"Received: produces={declared!r}. Use e.g. produces=('val_score',)."
            )
        for name in declared:
            if any(ch in str(name) for ch in "*?["):
                patterns.append(str(name))
            else:
                names.add(str(name))
    return frozenset(names), tuple(patterns)


def _monitors(plan: Plan) -> list[tuple[str, str]]:
    """`(who, name)` of every monitored metric name of the plan."""
    out = [
        (f"{type(cb).__name__}(monitor={name!r})", name)
        for cb in plan.callbacks
        if isinstance(name := getattr(cb, "monitor", None), str)
    ]
    ck = plan.checkpoint
    if ck is not None and (ck.keep_best or plan.restore_best):
        out.append((f"Checkpoint(monitor={ck.monitor!r})", ck.monitor))
    return out


def check_monitors(adapter: Adapter, plan: Plan) -> None:
    """Refuse a monitored `val_` name that nothing in the run produces.

    Raises:
        ConfigError: the name, what the run produces, and the fix.
    """
    watched = [(who, name) for who, name in _monitors(plan) if name.startswith("val_")]
    if not watched:
        return
    produced = produced_validation_metrics(adapter, plan)
    if produced is None:
        return
    names, patterns = produced
    for who, name in watched:
        if name in names or any(fnmatch.fnmatchcase(name, p) for p in patterns):
            continue
        listed = ", ".join(sorted(names))
        if patterns:
            listed += f", and names matching {', '.join(patterns)}"
        raise ConfigError(
            f"{who} watches a metric that no part of the run produces. Received: "
            f"monitor={name!r}; the validation produces {listed}. Pass one of them, add the "
            "metric to `metrics=` (it is then recorded as 'val_<name>'), or declare it in "
            "the `produces` of the callback that reports it."
        )
