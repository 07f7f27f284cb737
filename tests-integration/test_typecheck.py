"""Every workspace package and the examples pass mypy; every `type: ignore` says why.

The configuration is `[tool.mypy]` in the root pyproject: `check_untyped_defs`, every
member's `src` folder and `examples/` on `mypy_path`, and `ignore_missing_imports` only for
the third-party modules listed there that ship no type information (keras, optax, orbax,
grain, ...: their names are `Any`, so calls into them are not checked). jax, equinox, torch,
lightning, numpy and matplotlib ship types and are checked against.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p.name for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists())
TARGETS = [f"packages/{name}/src/pipekit_train/{name}" for name in PACKAGES] + ["examples"]
COMMAND = "uv run mypy " + " ".join(TARGETS)
# `# type: ignore[code]  # reason`: an error code, then why the checker is wrong there.
IGNORE = re.compile(r"#\s*type:\s*ignore")
IGNORE_WITH_REASON = re.compile(r"# type: ignore\[[a-z-]+(, [a-z-]+)*\]  # \S")


def test_every_member_and_the_examples_are_on_the_mypy_path() -> None:
    assert PACKAGES == ["core", "equinox", "keras", "lightning", "sweep"]
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["mypy_path"].split(":") == [
        *(f"packages/{name}/src" for name in ["core", "equinox", "lightning", "keras", "sweep"]),
        "examples",
    ]
    assert mypy["check_untyped_defs"] and mypy["warn_unused_ignores"]


def test_every_type_ignore_names_its_code_and_a_reason() -> None:
    bare = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for folder in TARGETS
        for path in sorted((ROOT / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if IGNORE.search(line) and not IGNORE_WITH_REASON.search(line)
    ]
    assert bare == [], "write `# type: ignore[code]  # reason`:\n" + "\n".join(bare)


@pytest.mark.slow  # a cold run over torch, jax and lightning's types: about 2 minutes
def test_mypy_passes_on_every_package_and_the_examples() -> None:
    proc = subprocess.run(
        # A fresh cache only costs its writing (a sixth of the run): write none.
        [sys.executable, "-m", "mypy", *TARGETS, "--cache-dir", os.devnull],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"run `{COMMAND}`:\n" + proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "no issues found in" in proc.stdout
