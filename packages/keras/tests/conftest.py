"""Test set-up for pipekit-train-keras.

Keras fixes its backend when it is first imported, so the backend of a test process
comes from `KERAS_BACKEND` (default here: jax; an unset variable would make keras try
tensorflow). The torch-backend run of the same tests happens in a subprocess
(`test_keras_backends.py`).
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def keras_backend() -> str:
    """The Keras backend of this test process."""
    import keras

    return keras.backend.backend()
