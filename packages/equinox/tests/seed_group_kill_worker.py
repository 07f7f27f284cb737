"""Subprocess worker of the SeedGroup kill-and-resume test.

`python seed_group_kill_worker.py <checkpoint_dir> <steps>` trains five seeds of the
test's description in one group, checkpointing every 10 steps; the test kills it with
SIGKILL while it runs.
"""

from __future__ import annotations

import sys


def main(directory: str, steps: str) -> None:
    from pathlib import Path

    from test_equinox_seed_group import loop

    from pipekit_train.core import SeedGroup

    SeedGroup(loop(steps=int(steps), directory=Path(directory)), seeds=[0, 1, 2, 3, 4]).run()
    print("worker finished without being killed", flush=True)
    sys.exit(3)


if __name__ == "__main__":
    main(*sys.argv[1:3])
