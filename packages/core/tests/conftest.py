"""Fixtures of core's tests."""

from __future__ import annotations

import pytest

# what `scheduler_job()` reads: a test that runs under SLURM (or torchelastic) must not
# judge leases by the job it happens to run in
SCHEDULER_VARIABLES = (
    "SLURM_JOB_ID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_STEP_ID",
    "SLURM_RESTART_COUNT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "PIPEKIT_TRAIN_JOB_ID",
    "PIPEKIT_TRAIN_JOB_RESTART",
)


@pytest.fixture
def no_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the test outside any scheduler job."""
    for name in SCHEDULER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
