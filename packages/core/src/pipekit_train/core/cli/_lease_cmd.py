"""`pipekit-train checkpoint lease LOCATION`: which run holds a checkpoint location."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import IO

from pipekit_train.core.checkpoint._lease import read_lease, takeover_reason
from pipekit_train.core.checkpoint._policy import Checkpoint

__all__ = ["checkpoint_lease"]


def checkpoint_lease(
    location: str,
    *,
    storage_options: dict[str, object] | None = None,
    as_json: bool = False,
    out: IO[str] | None = None,
) -> int:
    """Print the holder of `location`'s run lease; exit status 0 when free, 1 when held.

    A holder that would be taken over by the next run (its process is gone on this host,
    or its heartbeat is older than the default lease time) is reported as stale.
    """
    out = out or sys.stdout
    policy = Checkpoint(location, storage_options=storage_options)
    holder = read_lease(policy)
    stale = None if holder is None else takeover_reason(holder, timeout=policy.lease_timeout or 0.0)
    if as_json:
        report = {
            "location": policy.location,
            "holder": None if holder is None else asdict(holder),
            "stale": stale,
        }
        print(json.dumps(report, indent=2), file=out)
    elif holder is None:
        print(f"{policy.location}: no run holds it", file=out)
    else:
        print(f"{policy.location}: held by {holder.describe()}", file=out)
        if stale is not None:
            print(f"  stale ({stale}): the next run takes it over", file=out)
    return 0 if holder is None else 1
