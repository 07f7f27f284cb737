"""`pipekit-train checkpoint lease LOCATION`: which run holds a checkpoint location."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import IO

from pipekit_train.core.checkpoint._lease import inspect_lease
from pipekit_train.core.checkpoint._lease_records import lease_records
from pipekit_train.core.checkpoint._policy import Checkpoint

__all__ = ["checkpoint_lease"]

_TIMEOUT = 120.0  # the default `Checkpoint.lease_timeout`


def checkpoint_lease(
    location: str,
    *,
    storage_options: dict[str, object] | None = None,
    lease_timeout: float = _TIMEOUT,
    as_json: bool = False,
    out: IO[str] | None = None,
) -> int:
    """Print the state of `location`'s run lease as a run started here would find it.

    The verdict is the one `RunLease.acquire` reaches (`inspect_lease`, the same rules):
    exit status 0 when a run started now would take the lease (free, released, or a dead
    holder it would take over: "stale"), 1 when it would be refused (a live holder, or an
    unreadable record younger than `lease_timeout`).
    """
    out = out or sys.stdout
    policy = Checkpoint(location, storage_options=storage_options, lease_timeout=None)
    state = inspect_lease(lease_records(policy), timeout=float(lease_timeout))
    holder = state.holder
    if as_json:
        report = {
            "location": policy.location,
            "generation": state.generation,
            "state": state.status,
            "holder": None if holder is None or holder.released else asdict(holder),
            "last_holder": None if holder is None else asdict(holder),
            "stale": state.reason if state.status == "stale" else None,
            "reason": state.reason,
            "unreadable_age_s": state.unreadable_age,
        }
        print(json.dumps(report, indent=2), file=out)
    elif state.status == "free":
        last = f" (last held by {holder.describe()}; released)" if holder is not None else ""
        print(f"{policy.location}: no run holds it{last}", file=out)
    else:
        print(f"{policy.location}: held by {state.describe()}", file=out)
        if state.status == "stale":
            print(f"  stale ({state.reason}): the next run takes it over", file=out)
        elif holder is None:
            print(f"  {state.reason}", file=out)
    return 0 if state.may_take else 1
