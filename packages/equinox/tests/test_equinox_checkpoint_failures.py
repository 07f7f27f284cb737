"""A full checkpoint disk on Equinox: one clean `CheckpointError`, and a quiet shutdown.

Orbax's failed write used to end in a screen of "Event loop is closed" noise and
`ImportError: sys.meta_path is None` at interpreter shutdown. A child process trains with
its checkpoints on a real 192 KiB tmpfs until it fills; its stderr must hold one
`CheckpointError` traceback and none of that noise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipekit_train.core.checkpoint._lease import LEASE_DIR
from pipekit_train.core.testing import SmallFilesystemUnavailable, small_filesystem

CHILD = """
import sys
from pipekit_train.core import Checkpoint, TrainingLoop
from pipekit_train.core.testing import regression_task
from pipekit_train.equinox import EquinoxModelOp

train, val = regression_task()
TrainingLoop(
    model=EquinoxModelOp("pipekit_train.equinox.testing:linear", in_size=4, out_size=1, seed=0),
    data=train, loss="mse", optimizer_config={"name": "adam", "lr": 0.05}, batch_size=16,
    max_steps=5000, seed=0, progress=False,
    checkpoint=Checkpoint(sys.argv[1], every_n_steps=2, max_to_keep=None),
).run()
"""


@pytest.mark.slow
def test_full_disk_ends_with_one_checkpoint_error_and_a_quiet_shutdown(tmp_path: Path) -> None:
    try:
        mounted = small_filesystem(tmp_path / "small", "192k")
        small = mounted.__enter__()
    except SmallFilesystemUnavailable as exc:
        pytest.skip(f"a tmpfs cannot be mounted here: {exc}")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, os.fspath(small / "ck")],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "JAX_PLATFORMS": "cpu"},
        )
        leftovers = [
            p.name for p in (small / "ck").iterdir() if not p.name.isdigit() and p.name != LEASE_DIR
        ]
    finally:
        mounted.__exit__(None, None, None)
    err = proc.stderr
    assert proc.returncode == 1, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("pipekit_train.core._errors.CheckpointError: Could not write"), err[
        -3000:
    ]
    assert "latest complete checkpoint is" in last
    for noise in ("Event loop is closed", "sys.meta_path is None", "Exception ignored"):
        assert noise not in err, err[-5000:]
    assert leftovers == [], leftovers
