"""Test set-up for pipekit-train-keras.

Keras fixes its backend when it is first imported, so the backend of a test process
comes from `KERAS_BACKEND` (default here: jax; an unset variable would make keras try
tensorflow). The torch-backend run of the same tests happens in a subprocess
(`test_keras_backends.py`, the conformance suite included).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "jax")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def keras_backend() -> str:
    """The Keras backend of this test process."""
    import keras

    return keras.backend.backend()


def _torch_pass(*targets: str) -> None:
    """`pytest TARGETS` under KERAS_BACKEND=torch, in one subprocess; fails with its tail."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *targets,
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            "-W",
            "ignore::DeprecationWarning",
            "-n",  # in this one process: the suite around it already runs on two workers
            "0",
        ],
        cwd=Path(__file__).resolve().parents[3],
        env={
            **{k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "XLA_FLAGS")},
            "KERAS_BACKEND": "torch",
        },
        capture_output=True,
        text=True,
        timeout=3600,
    )
    tail = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout and " failed" not in proc.stdout, tail


@pytest.fixture(scope="session")
def torch_pass() -> Any:
    """`torch_pass(*pytest_args)`: pytest under KERAS_BACKEND=torch in one subprocess."""
    return _torch_pass
