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
