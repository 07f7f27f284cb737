"""Worker processes that die with their sweep.

A sweep's process-executor workers are started with `spawn`. If the sweep process is
killed (SIGKILL, the OOM killer, a pre-empted job), nothing tells a worker that is busy
training, and it would keep training and writing into its trial directory, racing a
rerun of the sweep. `die_with_parent(parent_pid)` runs first in every worker and:

- on Linux, asks the kernel to SIGKILL the worker when its parent dies
  (`prctl(PR_SET_PDEATHSIG, SIGKILL)` through ctypes);
- everywhere, starts a daemon thread that checks every `interval` seconds whether the
  parent is still the process that started the worker (`os.getppid()`: a dead parent's
  children are re-parented) and ends the worker with `os._exit` when it is not.

The thread is the portable fallback (macOS, and Linux where `prctl` is unavailable);
the two together end a worker within about `interval` seconds of its sweep's death.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1
#: Exit status of a worker that ended because its sweep died.
ORPHAN_EXIT_CODE = 70


def _set_pdeathsig() -> bool:
    """Linux: have the kernel SIGKILL this process when its parent dies."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):  # pragma: no cover - no libc / no prctl
        return False


def _watch(parent_pid: int, interval: float) -> None:
    while True:
        if os.getppid() != parent_pid:
            os._exit(ORPHAN_EXIT_CODE)
        time.sleep(interval)


def die_with_parent(parent_pid: int, interval: float = 0.25) -> None:
    """End this process soon after `parent_pid` (the process that started it) dies.

    Used as the `ProcessPoolExecutor` initializer of the process executor.

    Args:
        parent_pid: the pid of the sweep process (`os.getpid()` there).
        interval: seconds between two checks of the portable fallback.
    """
    _set_pdeathsig()
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(ORPHAN_EXIT_CODE)
    threading.Thread(
        target=_watch, args=(parent_pid, interval), name="pipekit-sweep-lifeline", daemon=True
    ).start()
