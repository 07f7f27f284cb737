"""`.github/scripts/ci_status.py`: the release waits for CI on the tagged commit.

The decision is a pure function of the GitHub API's `workflow_runs` list; these tests
feed it run records in the API's shape.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / ".github" / "scripts" / "ci_status.py"
SHA = "a" * 40


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pipekit_ci_status", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ci_status = _load()


def run(n: int, status: str, conclusion: str | None, event: str = "push", sha: str = SHA) -> dict:
    return {
        "head_sha": sha,
        "event": event,
        "status": status,
        "conclusion": conclusion,
        "run_number": n,
        "created_at": f"2026-01-01T00:00:{n:02d}Z",
        "html_url": f"https://github.com/o/r/actions/runs/{n}",
    }


@pytest.mark.parametrize(
    ("runs", "state"),
    [
        ([], "missing"),
        # a pull_request run tests a merge commit and only the changed members: not enough
        ([run(1, "completed", "success", event="pull_request")], "missing"),
        ([run(1, "completed", "success", sha="b" * 40)], "missing"),
        ([run(1, "completed", "success")], "success"),
        ([run(1, "completed", "success", event="workflow_dispatch")], "success"),
        ([run(1, "in_progress", None)], "pending"),
        ([run(1, "queued", None)], "pending"),
        ([run(1, "completed", "failure")], "failure"),
        ([run(1, "completed", "cancelled")], "failure"),
        # the newest run decides: a re-run in progress waits, a fixed re-run passes
        ([run(1, "completed", "failure"), run(2, "in_progress", None)], "pending"),
        ([run(2, "completed", "success"), run(1, "completed", "failure")], "success"),
        ([run(1, "completed", "success"), run(2, "completed", "failure")], "failure"),
    ],
)
def test_verdict(runs: list[dict], state: str) -> None:
    got, message = ci_status.verdict(runs, SHA)
    assert got == state
    assert SHA in message


def test_failure_message_links_the_run_and_says_what_to_do() -> None:
    _, message = ci_status.verdict([run(7, "completed", "timed_out")], SHA)
    assert "https://github.com/o/r/actions/runs/7" in message and "'timed_out'" in message
    assert "gh workflow run ci.yml --ref <tag>" in message


def test_runs_url() -> None:
    assert ci_status.runs_url("https://api.github.com/", "o/r", "ci.yml", SHA) == (
        f"https://api.github.com/repos/o/r/actions/workflows/ci.yml/runs?head_sha={SHA}&per_page=100"
    )


def test_an_unreachable_api_gives_up_after_the_timeout() -> None:
    # nothing listens on this loopback port: every check is a transient error
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--repo", "o/r", "--sha", SHA, "--timeout", "0"],
        capture_output=True,
        text=True,
        env={"GITHUB_API_URL": "http://127.0.0.1:9", "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert proc.returncode == 1
    assert "Gave up after 0s waiting for CI" in proc.stdout
