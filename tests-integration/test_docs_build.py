"""The documentation site builds with `mkdocs build --strict`.

Strict mode turns every warning into an error: a nav entry or link whose page is
missing, a broken anchor, an API reference (`::: pipekit_train.<pkg>`) that cannot be
collected, or a docstring griffe cannot parse. The first test names the nav pages that
do not exist, which is the usual cause while guides are still being written.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("mkdocs", reason="mkdocs is in the root dev group (uv sync)")
pytest.importorskip("material", reason="mkdocs-material is in the root dev group (uv sync)")
pytest.importorskip(
    "mkdocstrings", reason="mkdocstrings[python] is in the root dev group (uv sync)"
)


def _nav_pages(nav: Any) -> list[str]:
    pages: list[str] = []
    if isinstance(nav, str):
        if not nav.startswith(("http://", "https://")):
            pages.append(nav)
    elif isinstance(nav, list):
        for item in nav:
            pages += _nav_pages(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            pages += _nav_pages(value)
    return pages


def _load_nav() -> list[str]:
    from mkdocs.config import load_config

    config = load_config(str(ROOT / "mkdocs.yml"))
    return _nav_pages(config["nav"])


def test_nav_pages_exist() -> None:
    pages = _load_nav()
    assert pages, "mkdocs.yml has no nav"
    missing = [p for p in pages if not (ROOT / "docs" / p).is_file()]
    assert not missing, f"mkdocs.yml's nav names pages that do not exist under docs/: {missing}"


@pytest.mark.slow  # the strict mkdocs build, with mkdocstrings
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    output = proc.stdout + proc.stderr
    problems = [line for line in output.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert proc.returncode == 0, "mkdocs build --strict failed:\n" + (
        "\n".join(problems) or output[-4000:]
    )
    site = tmp_path / "site"
    for page in ("index.html", "api/core/index.html", "changelog/index.html"):
        assert (site / page).is_file(), f"{page} was not built"
    for name in ("quickstart", "cycle_handoff"):  # notebooks render with their outputs
        html = (site / "notebooks" / name / "index.html").read_text()
        assert "data:image/png" in html, f"the {name} notebook page shows no figure"
    api = (site / "api" / "core" / "index.html").read_text()
    assert "pipekit_train.core.TrainingLoop" in api, (
        "the core API reference did not render TrainingLoop"
    )
