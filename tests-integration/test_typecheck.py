"""`pipekit_train.core` (the backend contract included) passes mypy.

The configuration is `[tool.mypy]` in the root pyproject (`check_untyped_defs`, and
`ignore_missing_imports` only for the third-party modules listed there that ship no
type information).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a cold mypy run takes about a minute

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_passes_on_core(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "-p", "pipekit_train.core"]
        + ["--cache-dir", str(tmp_path / "mypy_cache")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (
        "run `uv run mypy -p pipekit_train.core`:\n" + proc.stdout[-6000:] + proc.stderr[-2000:]
    )
