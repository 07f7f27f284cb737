"""`plant_lease`: a lease file naming a holder, for tests of one run per location."""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path

from pipekit_train.core.checkpoint._lease import LEASE_FILE, LeaseHolder

__all__ = ["plant_lease"]


def plant_lease(directory: str | Path, pid: int, *, host: str | None = None) -> LeaseHolder:
    """Write a lease at `directory` naming process `pid` on `host` (this host by default),
    heartbeat now; return the holder. A live `pid` makes the location held."""
    now = time.time()
    holder = LeaseHolder(
        host=socket.gethostname() if host is None else host,
        pid=int(pid),
        token=uuid.uuid4().hex,
        fingerprint="0" * 12,
        started=now - 30,
        heartbeat=now,
    )
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LEASE_FILE).write_bytes(holder.to_bytes())
    return holder
