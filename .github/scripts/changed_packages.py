"""Which workspace members a change touches: the per-package CI matrix.

    python .github/scripts/changed_packages.py --base origin/main     # prints ["core", ...]

A change to a member's folder tests that member. A change to core, the root
`pyproject.toml`, `uv.lock`, `.python-version` or `.github/` tests every member, because
they all depend on those. Without `--base` (a push to main, a manual run), or if git
cannot diff, every member is tested. Docs, examples, benchmarks and tests-integration
run in their own jobs. Under GitHub Actions the result is also written to
`$GITHUB_OUTPUT` as `packages=<json list>`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

MEMBERS = ("core", "equinox", "lightning", "keras", "sweep")
EVERYTHING = ("pyproject.toml", "uv.lock", ".python-version", ".github/", "packages/core/")


def changed_files(base: str) -> list[str] | None:
    """Files changed between the merge base of `base` and HEAD (None if git fails)."""
    try:
        out = subprocess.run(
            ["git", "diff", "--name-only", f"{base}...HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [line.strip() for line in out.splitlines() if line.strip()]


def members_for(files: list[str] | None) -> list[str]:
    """The members to test for these changed files (all of them when unknown)."""
    if files is None:
        return list(MEMBERS)
    touched: set[str] = set()
    for path in files:
        if path in EVERYTHING or path.startswith(tuple(p for p in EVERYTHING if p.endswith("/"))):
            return list(MEMBERS)
        parts = path.split("/")
        if len(parts) > 2 and parts[0] == "packages" and parts[1] in MEMBERS:
            touched.add(parts[1])
    return [m for m in MEMBERS if m in touched]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=None, help="git ref to diff against (e.g. origin/main)")
    args = parser.parse_args(argv)
    members = members_for(changed_files(args.base) if args.base else None)
    print(json.dumps(members))
    output = os.environ.get("GITHUB_OUTPUT")
    if output:
        with open(output, "a") as fh:
            fh.write(f"packages={json.dumps(members)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
