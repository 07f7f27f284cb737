"""Wait until CI has passed on a commit: the release workflow's gate.

    python .github/scripts/ci_status.py --repo owner/name --sha <commit> [--timeout 5400]

A release builds and publishes the tagged commit only after the CI workflow (`ci.yml`)
succeeded on that same commit. The script asks the GitHub REST API for the CI runs of
the commit (`GET /repos/{repo}/actions/workflows/ci.yml/runs?head_sha=<sha>`) and looks
at the runs started by `push` or `workflow_dispatch` only: those check out exactly this
commit and test every member (a `pull_request` run tests a merge commit, and only the
members the pull request touched). The newest such run decides:

- completed with `success`: done, exit 0;
- queued or in progress: wait and ask again (every `--interval` seconds);
- completed otherwise (failure, cancelled, timed out): exit 1 with the run's link;
- no run yet: wait (CI may not have started), and give up after `--timeout`.

A run cancelled because a later push to main superseded it also stops the release: run
CI on the tag (`gh workflow run ci.yml --ref <tag>`) and re-run the release
(`gh run rerun <release run id>`). Needs `GITHUB_TOKEN` (the workflow's token with
`actions: read`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any

EVENTS = ("push", "workflow_dispatch")
PENDING = ("queued", "in_progress", "waiting", "requested", "pending")


def runs_url(api: str, repo: str, workflow: str, sha: str) -> str:
    """The REST endpoint listing a workflow's runs for one commit."""
    return f"{api.rstrip('/')}/repos/{repo}/actions/workflows/{workflow}/runs?head_sha={sha}&per_page=100"


def verdict(runs: Iterable[Mapping[str, Any]], sha: str) -> tuple[str, str]:
    """`(state, message)` for the CI runs of `sha`: state is success/pending/failure/missing."""
    mine = [r for r in runs if r.get("head_sha") == sha and r.get("event") in EVENTS]
    if not mine:
        return "missing", f"No CI run (push or workflow_dispatch) on {sha} yet."
    newest = max(mine, key=lambda r: (r.get("created_at") or "", r.get("run_number") or 0))
    link = newest.get("html_url", "")
    if newest.get("status") in PENDING or newest.get("status") != "completed":
        return "pending", f"CI on {sha} is {newest.get('status')}: {link}"
    if newest.get("conclusion") == "success":
        return "success", f"CI passed on {sha}: {link}"
    return "failure", (
        f"CI on {sha} concluded {newest.get('conclusion')!r}: {link}. Fix it, or re-run CI on "
        "the tag (`gh workflow run ci.yml --ref <tag>`), then re-run this release."
    )


def fetch_runs(url: str, token: str | None) -> list[dict[str, Any]]:
    """The `workflow_runs` of one API page."""
    request = urllib.request.Request(url, headers={"Accept": "application/vnd.github+json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=30) as response:
        return list(json.load(response).get("workflow_runs", []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True, help="owner/name")
    parser.add_argument("--sha", required=True, help="the commit the release tag points to")
    parser.add_argument("--workflow", default="ci.yml")
    parser.add_argument("--timeout", type=float, default=5400.0, help="seconds to wait")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between checks")
    args = parser.parse_args(argv)
    url = runs_url(
        os.environ.get("GITHUB_API_URL", "https://api.github.com"),
        args.repo,
        args.workflow,
        args.sha,
    )
    token = os.environ.get("GITHUB_TOKEN") or os.environ.get("GH_TOKEN")
    deadline = time.monotonic() + args.timeout
    while True:
        try:
            state, message = verdict(fetch_runs(url, token), args.sha)
        except OSError as exc:  # a transient API error: ask again
            state, message = "pending", f"GitHub API error: {exc}"
        print(message, flush=True)
        if state == "success":
            return 0
        if state == "failure":
            print(f"::error::{message}" if os.environ.get("GITHUB_ACTIONS") else message)
            return 1
        if time.monotonic() + args.interval > deadline:
            message = (
                f"Gave up after {args.timeout:.0f}s waiting for CI on {args.sha} ({message}). "
                "Run CI on the tag (`gh workflow run ci.yml --ref <tag>`), then re-run the release."
            )
            print(f"::error::{message}" if os.environ.get("GITHUB_ACTIONS") else message)
            return 1
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
