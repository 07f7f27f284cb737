"""Shared fixtures of the Lightning adapter tests."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def lightning_module() -> Any:
    """`import lightning` once per session (≈14 s cold)."""
    import lightning

    return lightning


@pytest.fixture(scope="module")
def regression() -> Any:
    """The conformance suite's regression task: `(train, validation)`."""
    from pipekit_train.core.testing import regression_task

    return regression_task()


@pytest.fixture(scope="session")
def torch_worker() -> Any:
    """`torch_worker.py` as a module: its `build(spec, kill_at=...)` makes the test's loops."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).with_name("torch_worker.py")
    spec = importlib.util.spec_from_file_location("pipekit_lightning_torch_worker", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
