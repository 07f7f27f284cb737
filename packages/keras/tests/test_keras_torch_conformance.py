"""The adapter conformance suite on Keras's torch backend, in a subprocess.

Its own file, apart from the rest of the torch pass (`test_keras_backends.py`), so that the
two long subprocesses run on two pytest workers at once.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import keras
import pytest


@pytest.mark.slow
@pytest.mark.skipif(
    keras.backend.backend() == "torch", reason="this is the runner of the torch-backend pass"
)
def test_torch_backend_passes_the_conformance_suite(torch_pass: Callable[..., None]) -> None:
    torch_pass(str(Path(__file__).resolve().parent / "test_keras_conformance.py"))
