"""The workspace passes `ruff check` and `ruff format --check` (config: the root pyproject).

This is also what enforces, mechanically, that `pipekit_train.core` never imports a
backend: `packages/core/pyproject.toml` bans jax, torch, keras, equinox, lightning,
tensorflow, optax and orbax imports (`flake8-tidy-imports.banned-api`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_ruff_check_passes() -> None:
    proc = _ruff("check", ".", "--output-format", "concise")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_ruff_format_is_applied() -> None:
    proc = _ruff("format", "--check", ".")
    assert proc.returncode == 0, (
        "run `uv run ruff format .`:\n" + proc.stdout[-4000:] + proc.stderr[-2000:]
    )


def test_ruff_rejects_a_backend_import_in_core() -> None:
    probe = ROOT / "packages" / "core" / "src" / "pipekit_train" / "core" / "_probe.py"
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--output-format", "concise"]
        + ["--stdin-filename", str(probe), "-"],
        input='"""Probe."""\n\nimport jax\n\n__all__ = ["jax"]\n',
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "TID251" in proc.stdout and "never imports a backend" in proc.stdout


def test_adapters_import_only_public_core_modules() -> None:
    """Backends use the contract (`pipekit_train.core.adapter`), never `core._private`."""
    import re

    # `core._x`, `core.testing._x`, ... in imports and in factory strings alike
    private = re.compile(r"pipekit_train\.core(\.\w+)*\._\w+|from pipekit_train\.core\S* import _")
    offenders = []
    for package in ("equinox", "lightning", "keras", "sweep"):
        for path in sorted((ROOT / "packages" / package / "src").rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if private.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
