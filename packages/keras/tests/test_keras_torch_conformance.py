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
    # The fused variant's preemption cases (SIGTERM, SIGUSR1 during a write, max_time) test
    # core's lifecycle at a fused-call boundary, which does not depend on Keras's backend:
    # they run in the jax pass; here the fused variant keeps its training and resume cases.
    torch_pass(
        str(Path(__file__).resolve().parent / "test_keras_conformance.py"),
        "-k",
        "not (FusedSteps and (sigterm or sigusr1 or max_time))",
    )
