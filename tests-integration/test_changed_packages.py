"""`.github/scripts/changed_packages.py`: the CI matrix, run on real git repositories.

Each test builds a small repository in a temporary folder with a synthetic `uv.lock`
(the same layout uv writes: `[manifest]`, `[[package]]` entries with `dependencies`,
`[package.optional-dependencies]` and `[package.dev-dependencies]`), commits a change
on a branch and runs the script against `main`, exactly as the CI job does.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".github" / "scripts" / "changed_packages.py"
ALL = ["core", "equinox", "lightning", "keras", "sweep"]

HEADER = """version = 1
revision = 3
requires-python = ">=3.11"

[manifest]
members = [
    "pipekit-train-core",
    "pipekit-train-equinox",
    "pipekit-train-keras",
    "pipekit-train-lightning",
    "pipekit-train-sweep",
    "pipekit-train-workspace",
]
"""

# name -> (version, dependencies, optional-dependencies, dev-dependencies, source)
PACKAGES: dict[str, tuple] = {
    "pipekit-train-core": (
        "0.1.0",
        ["numpy"],
        {"plot": ["matplotlib"]},
        {},
        '{ editable = "packages/core" }',
    ),
    "pipekit-train-equinox": ("0.1.0", ["pipekit-train-core", "jax", "toolz"], {}, {}, None),
    "pipekit-train-lightning": (
        "0.1.0",
        ["pipekit-train-core", "torch", ("toolz", ["extra-bits"])],
        {},
        {},
        None,
    ),
    "pipekit-train-keras": (
        "0.1.0",
        ["pipekit-train-core", "keras"],
        {"jax": ["jax"], "torch": ["torch"]},
        {},
        None,
    ),
    "pipekit-train-sweep": ("0.1.0", ["pipekit-train-core"], {"optuna": ["optuna"]}, {}, None),
    "pipekit-train-workspace": (
        "0.0.0",
        [f"pipekit-train-{m}" for m in ALL],
        {},
        {"dev": ["pytest"]},
        '{ virtual = "." }',
    ),
    "numpy": ("2.0.0", [], {}, {}, None),
    "matplotlib": ("3.9.0", ["numpy"], {}, {}, None),
    "jax": ("0.4.30", ["numpy"], {}, {}, None),
    "torch": ("2.4.0", ["filelock"], {}, {}, None),
    "filelock": ("3.15.0", [], {}, {}, None),
    "keras": ("3.5.0", ["numpy"], {}, {}, None),
    "optuna": ("4.0.0", ["sqlalchemy"], {}, {}, None),
    "sqlalchemy": ("2.0.0", [], {}, {}, None),
    "toolz": ("1.0.0", [], {"extra-bits": ["cytoolz"]}, {}, None),
    "cytoolz": ("1.0.0", [], {}, {}, None),
    "pytest": ("8.3.0", ["pluggy"], {}, {}, None),
    "pluggy": ("1.5.0", [], {}, {}, None),
}


def _dep(d: str | tuple) -> str:
    if isinstance(d, tuple):
        return f'{{ name = "{d[0]}", extra = {json.dumps(d[1])} }}'
    return f'{{ name = "{d}" }}'


def lock_text(packages: dict[str, tuple] = PACKAGES, header: str = HEADER) -> str:
    """A uv.lock-shaped TOML text for these packages."""
    parts = [header]
    for name in sorted(packages):
        version, deps, optional, dev, source = packages[name]
        source = source or '{ registry = "https://pypi.org/simple" }'
        lines = ["[[package]]", f'name = "{name}"', f'version = "{version}"', f"source = {source}"]
        if deps:
            lines.append("dependencies = [" + ", ".join(_dep(d) for d in deps) + "]")
        if source.startswith("{ registry"):
            digest = hashlib.sha256(f"{name}=={version}".encode()).hexdigest()
            lines.append(
                f'wheels = [{{ url = "https://files.example/{name}-{version}-py3-none-any.whl", '
                f'hash = "sha256:{digest}" }}]'
            )
        for table, groups in (("optional-dependencies", optional), ("dev-dependencies", dev)):
            if groups:
                lines.append(f"\n[package.{table}]")
                for group, members in groups.items():
                    lines.append(f"{group} = [" + ", ".join(_dep(d) for d in members) + "]")
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def _with(name: str, **changes: object) -> dict[str, tuple]:
    """PACKAGES with one entry's fields replaced (version=, deps=, optional=)."""
    out = dict(PACKAGES)
    version, deps, optional, dev, source = out[name]
    out[name] = (
        changes.get("version", version),
        changes.get("deps", deps),
        changes.get("optional", optional),
        dev,
        source,
    )
    return out


def _git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    return subprocess.run(
        ["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository on `main` with the base lock, a member file and a docs file."""
    _git(tmp_path, "init", "-q", "-b", "main")
    (tmp_path / "uv.lock").write_text(lock_text())
    for path in ("packages/equinox/src/a.py", "docs/index.md", "pyproject.toml"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x = 1\n")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-q", "-m", "base")
    _git(tmp_path, "checkout", "-q", "-b", "change")
    return tmp_path


def _change(repo: Path, files: dict[str, str]) -> list[str]:
    """Commit `files` on the branch and return the script's answer against main."""
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "change")
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--base", "main"],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "GITHUB_OUTPUT"},
    ).stdout
    return json.loads(out)


@pytest.mark.parametrize(
    ("packages", "expected"),
    [
        # an optional dependency of one member: only that member
        (_with("optuna", version="4.1.0"), ["sweep"]),
        # a transitive dependency (optuna -> sqlalchemy)
        (_with("sqlalchemy", version="2.0.1"), ["sweep"]),
        # torch: lightning directly, keras through its `torch` extra; equinox never
        (_with("torch", version="2.5.0"), ["lightning", "keras"]),
        (_with("filelock", version="3.16.0"), ["lightning", "keras"]),
        # an extra requested on an edge (toolz[extra-bits] from lightning only)
        (_with("cytoolz", version="1.1.0"), ["lightning"]),
        (_with("toolz", version="1.1.0"), ["equinox", "lightning"]),
        # under core: every member
        (_with("numpy", version="2.1.0"), ALL),
        # the workspace's dev group is installed in every member's job
        (_with("pluggy", version="1.6.0"), ALL),
        # a member's own entry (a new dependency that is also a new package)
        (
            {
                **_with("pipekit-train-sweep", deps=["pipekit-train-core", "tqdm"]),
                "tqdm": ("4.66.0", [], {}, {}, None),
            },
            ["sweep"],
        ),
        # a member drops a dependency another member still uses: only its own entry changed
        (_with("pipekit-train-equinox", deps=["pipekit-train-core", "jax"]), ["equinox"]),
        # a package removed from the lock: whoever used it (in the old lock)
        (
            {
                k: v
                for k, v in _with("pipekit-train-sweep", optional={}).items()
                if k not in ("optuna", "sqlalchemy")
            },
            ["sweep"],
        ),
    ],
    ids=[
        "optuna",
        "transitive",
        "torch",
        "torch-transitive",
        "edge-extra",
        "shared",
        "core-dependency",
        "dev-group",
        "new-dependency",
        "dropped-dependency",
        "removed-package",
    ],
)
def test_a_lock_change_schedules_the_members_whose_closure_holds_it(
    repo: Path, packages: dict[str, tuple], expected: list[str]
) -> None:
    assert _change(repo, {"uv.lock": lock_text(packages)}) == expected


def test_only_hashes_changed_is_still_a_change(repo: Path) -> None:
    text = lock_text().replace("files.example/optuna", "mirror.example/optuna")
    assert _change(repo, {"uv.lock": text}) == ["sweep"]


def test_reordered_entries_and_comments_are_not_a_change(repo: Path) -> None:
    head, *blocks = lock_text().split("[[package]]\n")
    text = head + "".join("[[package]]\n" + b for b in reversed(blocks)) + "\n# a comment\n"
    assert text != lock_text()
    assert _change(repo, {"uv.lock": text}) == []


def test_header_changes_and_unreadable_locks_schedule_everything(repo: Path) -> None:
    header = HEADER.replace('">=3.11"', '">=3.12"')
    assert _change(repo, {"uv.lock": lock_text(header=header)}) == ALL
    assert _change(repo, {"uv.lock": "this is = not [toml"}) == ALL


def test_lock_members_join_the_members_of_changed_folders(repo: Path) -> None:
    files = {
        "uv.lock": lock_text(_with("optuna", version="4.1.0")),
        "packages/equinox/src/a.py": "x = 2\n",
        "docs/index.md": "new\n",
    }
    assert _change(repo, files) == ["equinox", "sweep"]


def test_paths_outside_the_lock(repo: Path) -> None:
    assert _change(repo, {"docs/index.md": "new\n"}) == []
    assert _change(repo, {"packages/equinox/src/a.py": "x = 3\n"}) == ["equinox"]
    assert _change(repo, {"pyproject.toml": "x = 4\n"}) == ALL
    assert _change(repo, {"packages/core/src/b.py": "x = 5\n"}) == ALL


def test_without_a_base_or_git_every_member_is_tested(repo: Path, tmp_path_factory) -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT)], cwd=repo, check=True, capture_output=True, text=True
    ).stdout
    assert json.loads(out) == ALL
    outside = tmp_path_factory.mktemp("not-a-repo")
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--base", "main"],
        cwd=outside,
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "GIT_CEILING_DIRECTORIES": str(outside.parent)},
    ).stdout
    assert json.loads(out) == ALL
