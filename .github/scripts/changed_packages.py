"""Which workspace members a change touches: the per-package CI matrix.

    python .github/scripts/changed_packages.py --base origin/main     # prints ["core", ...]

A change to a member's folder tests that member. A change to core, the root
`pyproject.toml`, `.python-version` or `.github/` tests every member, because they all
depend on those.

A change to `uv.lock` tests only the members it can affect. The lock at the merge base
and at HEAD are parsed (tomllib) and compared package by package; a package entry that
was added, removed or changed in any field (version, source, hashes, dependencies)
affects exactly the members whose resolved dependency closure includes it, in the old
or the new lock. A member's closure is what its CI job installs (`uv sync --exact
--package <member> --all-extras --group dev --group test`): the member with all its
extras, every package reachable through `dependencies` (following the extras each edge
requests), its own dependency groups and the workspace root's. Environment markers are
ignored, so the closure errs on the side of testing more. A change outside the
`[[package]]` entries (lock `version`, `requires-python`, `resolution-markers`,
`[manifest]`, `[options]`), or a lock that cannot be read or parsed, tests every member.

Without `--base` (a push to main, a manual run), or if git cannot diff, every member is
tested. Docs, examples, benchmarks and tests-integration run in their own jobs. Under
GitHub Actions the result is also written to `$GITHUB_OUTPUT` as `packages=<json list>`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Mapping
from typing import Any

MEMBERS = ("core", "equinox", "lightning", "keras", "sweep")
DIST_PREFIX = "pipekit-train-"
LOCK = "uv.lock"
EVERYTHING = ("pyproject.toml", ".python-version", ".github/", "packages/core/")


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def merge_base(base: str) -> str | None:
    """The merge base of `base` and HEAD (what `git diff base...HEAD` compares with)."""
    out = _git("merge-base", base, "HEAD")
    return out.strip() if out and out.strip() else None


def changed_files(base: str) -> list[str] | None:
    """Files changed between the merge base of `base` and HEAD (None if git fails)."""
    out = _git("diff", "--name-only", f"{base}...HEAD")
    if out is None:
        return None
    return [line.strip() for line in out.splitlines() if line.strip()]


def file_at(rev: str, path: str) -> str | None:
    """The text of `path` at `rev` (None if it does not exist there or git fails)."""
    return _git("show", f"{rev}:{path}")


# -- uv.lock ---------------------------------------------------------------------------------


def normalize(name: str) -> str:
    """PEP 503 name normalisation (uv.lock already writes names this way)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _entries(lock: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for pkg in lock.get("package", []):
        out.setdefault(normalize(pkg["name"]), []).append(pkg)
    return out


def _canonical(entries: list[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(e, sort_keys=True) for e in entries)


def changed_lock_packages(old: Mapping[str, Any], new: Mapping[str, Any]) -> set[str] | None:
    """Names of the package entries that differ between two parsed locks.

    Returns None when something outside the `[[package]]` entries changed: that can
    affect every member.
    """
    header_old = {k: v for k, v in old.items() if k != "package"}
    header_new = {k: v for k, v in new.items() if k != "package"}
    if header_old != header_new:
        return None
    a, b = _entries(old), _entries(new)
    return {
        name
        for name in set(a) | set(b)
        if _canonical(a.get(name, [])) != _canonical(b.get(name, []))
    }


def _edges(entries: Iterable[dict[str, Any]], extras: Iterable[str]) -> list[tuple[str, tuple]]:
    """`(name, extras)` of the dependencies of these entries with these extras active."""
    out = []
    wanted = set(extras)
    for entry in entries:
        deps = list(entry.get("dependencies", []))
        optional = entry.get("optional-dependencies", {})
        for extra in wanted:
            deps.extend(optional.get(extra, []))
        out.extend((normalize(d["name"]), tuple(d.get("extra", []))) for d in deps)
    return out


def closure(lock: Mapping[str, Any], member: str) -> set[str]:
    """Every package name the member's CI environment can contain, per this lock."""
    entries = _entries(lock)
    dist = normalize(DIST_PREFIX + member)
    members = {normalize(DIST_PREFIX + m) for m in MEMBERS}
    manifest = lock.get("manifest", {})
    roots = [normalize(n) for n in manifest.get("members", []) if normalize(n) not in members]
    todo: list[tuple[str, tuple]] = []
    mine = entries.get(dist, [])
    todo.append(
        (dist, tuple(sorted({x for e in mine for x in e.get("optional-dependencies", {})})))
    )
    # the member's own groups and the workspace root's groups (`--group dev`)
    for name in [dist, *roots]:
        for entry in entries.get(name, []):
            if name != dist:
                todo.append((name, ()))  # the root entry itself, not its dependencies
            for group in entry.get("dev-dependencies", {}).values():
                todo.extend((normalize(d["name"]), tuple(d.get("extra", []))) for d in group)
    seen: set[tuple[str, str]] = set()
    names: set[str] = set()
    while todo:
        name, extras = todo.pop()
        key = (name, ",".join(sorted(extras)))
        if key in seen:
            continue
        seen.add(key)
        names.add(name)
        if name in roots:
            continue  # the root's own dependencies are every member: not installed
        todo.extend(_edges(entries.get(name, []), extras))
    return names


def members_for_lock(old_text: str | None, new_text: str | None) -> list[str]:
    """The members a change from `old_text` to `new_text` (uv.lock contents) can affect."""
    if old_text is None or new_text is None:
        return list(MEMBERS)
    try:
        old, new = tomllib.loads(old_text), tomllib.loads(new_text)
    except tomllib.TOMLDecodeError:
        return list(MEMBERS)
    changed = changed_lock_packages(old, new)
    if changed is None:
        return list(MEMBERS)
    return [m for m in MEMBERS if changed & (closure(old, m) | closure(new, m))]


# -- the decision ------------------------------------------------------------------------------


def members_for(files: list[str] | None, lock_members: Iterable[str] | None = None) -> list[str]:
    """The members to test for these changed files (all of them when unknown).

    Args:
        files: the changed paths, or None when unknown.
        lock_members: the members the `uv.lock` change affects (`members_for_lock`);
            None with `uv.lock` among `files` means every member.
    """
    if files is None:
        return list(MEMBERS)
    touched: set[str] = set()
    for path in files:
        if path in EVERYTHING or path.startswith(tuple(p for p in EVERYTHING if p.endswith("/"))):
            return list(MEMBERS)
        if path == LOCK:
            touched.update(MEMBERS if lock_members is None else lock_members)
            continue
        parts = path.split("/")
        if len(parts) > 2 and parts[0] == "packages" and parts[1] in MEMBERS:
            touched.add(parts[1])
    return [m for m in MEMBERS if m in touched]


def decide(base: str | None) -> list[str]:
    """The members to test for the change from the merge base of `base` to HEAD."""
    if not base:
        return list(MEMBERS)
    files = changed_files(base)
    lock_members = None
    if files is not None and LOCK in files:
        rev = merge_base(base)
        if rev is not None:
            lock_members = members_for_lock(file_at(rev, LOCK), file_at("HEAD", LOCK))
    return members_for(files, lock_members)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=None, help="git ref to diff against (e.g. origin/main)")
    args = parser.parse_args(argv)
    members = decide(args.base)
    print(json.dumps(members))
    output = os.environ.get("GITHUB_OUTPUT")
    if output:
        with open(output, "a") as fh:
            fh.write(f"packages={json.dumps(members)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
