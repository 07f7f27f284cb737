"""Parse a release tag and check it against the workspace: the release workflow's first step.

    python .github/scripts/release_info.py pipekit-train-equinox-v0.2.0

It checks that the tag names a workspace member (`pipekit-train-<member>-v<version>`),
that the version equals the one in `packages/<member>/pyproject.toml`, and that the
member's CHANGELOG has a dated `## [<version>] - YYYY-MM-DD` section. For a backend, it
checks that core is required with a range, not with `==`. It prints a JSON summary,
writes `dist=`, `member=`, `version=` and `extras=` (the extras the release test
installs, one per line of the wheel check) to `$GITHUB_OUTPUT`, and writes the
changelog section to `--notes PATH` for the GitHub release. It exits non-zero with a
clear message on any mismatch, before anything is built or published.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TAG = re.compile(
    r"^(?P<dist>pipekit-train-(?P<member>[a-z]+))-v(?P<version>\d+\.\d+\.\d+(?:[-._]?(?:a|b|rc|post|dev)\d+)?)$"
)
# Extras the release test installs in turn ("" = none). Keras without an extra only checks
# that no backend comes along; with one, the quickstart runs on that backend.
RELEASE_EXTRAS = {"keras": ["", "jax", "torch"]}


def fail(message: str) -> None:
    """Stop the release with `message`."""
    print(f"::error::{message}" if os.environ.get("GITHUB_ACTIONS") else message, file=sys.stderr)
    raise SystemExit(1)


def changelog_section(text: str, version: str) -> tuple[str, str] | None:
    """`(heading, body)` of `## [version] ...` in a Keep a Changelog file, or None."""
    match = re.search(
        rf"^(?P<head>## \[{re.escape(version)}\][^\n]*)\n(?P<body>.*?)(?=^## \[|\Z)",
        text,
        re.M | re.S,
    )
    return (match.group("head"), match.group("body").strip()) if match else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tag", help="e.g. pipekit-train-equinox-v0.2.0")
    parser.add_argument("--notes", type=Path, default=None, help="write the changelog section here")
    args = parser.parse_args(argv)

    match = TAG.match(args.tag)
    if not match:
        fail(
            f"Tag {args.tag!r} is not a release tag. Use pipekit-train-<member>-v<X.Y.Z>, e.g. pipekit-train-equinox-v0.2.0."
        )
    dist, member, version = match["dist"], match["member"], match["version"]
    pyproject = ROOT / "packages" / member / "pyproject.toml"
    if not pyproject.is_file():
        fail(f"Tag {args.tag!r} names {dist}, but there is no {pyproject.relative_to(ROOT)}.")
    project = tomllib.loads(pyproject.read_text())["project"]
    if project["name"] != dist:
        fail(f"{pyproject.relative_to(ROOT)} is {project['name']!r}, not {dist!r}.")
    if project["version"] != version:
        fail(
            f"Tag version {version} does not match {dist} {project['version']} in {pyproject.relative_to(ROOT)}. "
            f"Bump it with `uv version --package {dist} {version}` (and commit), or tag v{project['version']}."
        )

    changelog = ROOT / "packages" / member / "CHANGELOG.md"
    section = changelog_section(changelog.read_text(), version) if changelog.is_file() else None
    if section is None:
        fail(
            f"{changelog.relative_to(ROOT)} has no `## [{version}]` section. Add the release notes first."
        )
    heading, notes = section
    if not re.search(r"\d{4}-\d{2}-\d{2}", heading):
        fail(
            f"{changelog.relative_to(ROOT)}: `{heading}` has no release date. Write `## [{version}] - YYYY-MM-DD`."
        )

    core_range = None
    if member != "core":
        core_range = next(
            (
                d
                for d in project.get("dependencies", [])
                if d.replace(" ", "").startswith("pipekit-train-core")
            ),
            None,
        )
        if core_range is None:
            fail(f"{dist} does not depend on pipekit-train-core.")
        if "==" in core_range:
            fail(
                f"{dist} pins core with == ({core_range}); use a range such as pipekit-train-core>=0.1,<0.2."
            )

    extras = RELEASE_EXTRAS.get(member, [""])
    if args.notes:
        args.notes.write_text(notes + "\n")
    summary = {
        "dist": dist,
        "member": member,
        "version": version,
        "extras": extras,
        "core_range": core_range,
    }
    print(json.dumps(summary, indent=2))
    output = os.environ.get("GITHUB_OUTPUT")
    if output:
        with open(output, "a") as fh:
            fh.write(
                f"dist={dist}\nmember={member}\nversion={version}\nextras={json.dumps(extras)}\n"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
