"""Every code block of README.md and docs/**/*.md runs as written (or says why not).

One test per page: `docs_runner.py` runs the page's blocks in order in a subprocess of its
own (a page pays for its framework imports once; pages run in parallel under xdist), in a
fresh temporary directory holding a copy of `examples/`. The directives a page may use
(`<!-- docs: skip (reason) -->`, `output`, `replace`, `exit`, `env`, `setup`) are
described in `tests-integration/docs_runner.py`. Pages that train on several backends
are marked slow.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNNER = Path(__file__).with_name("docs_runner.py")

_spec = importlib.util.spec_from_file_location("pipekit_docs_runner", RUNNER)
assert _spec and _spec.loader
runner = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = runner
_spec.loader.exec_module(runner)

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Pages whose blocks take more than ~10 s on a 2-core machine (several backends, CLI runs).
SLOW = {
    "docs/cli.md",
    "docs/examples.md",
    "docs/guides/equinox.md",
    "docs/guides/keras.md",
    "docs/guides/lightning.md",
    "docs/guides/registry_and_cycle.md",
    "docs/guides/rollout-training.md",
    "docs/guides/sbi-diagnostics.md",
    "docs/guides/sbi.md",
    "docs/guides/sweep.md",
    "docs/index.md",
    "docs/training-spec.md",
}


def _run(page: Path, workdir: Path) -> tuple[subprocess.CompletedProcess[str], list[dict] | None]:
    shutil.copytree(ROOT / "examples", workdir / "examples", ignore=shutil.ignore_patterns("out"))
    env = {**os.environ, "KERAS_BACKEND": "jax", "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    report = workdir.parent / f"{workdir.name}-report.json"
    proc = subprocess.run(
        [sys.executable, str(RUNNER), str(page), "--json", str(report)],
        cwd=workdir,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    results = json.loads(report.read_text()) if report.is_file() else None
    return proc, results


def _params() -> list:
    params = []
    for page in PAGES:
        name = page.relative_to(ROOT).as_posix()
        marks = [pytest.mark.slow] if name in SLOW else []
        params.append(pytest.param(page, id=name, marks=marks))
    return params


@pytest.mark.parametrize("page", _params())
def test_page_blocks_run(page: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    proc, results = _run(page, workdir)
    assert results is not None, (
        f"the runner produced no report:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    )
    failures = [r for r in results if r["status"] == "fail"]
    assert not failures, "\n\n".join(
        f"{page.name}:{r['line']} [{r['lang']}]\n{r['error']}" for r in failures
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    for r in results:
        if r["status"] == "skipped":
            assert r["reason"], r


def _page(tmp_path: Path, text: str) -> list[dict]:
    page = tmp_path / "page.md"
    page.write_text(textwrap.dedent(text))
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        return runner.run_page(page)
    finally:
        os.chdir(cwd)


def test_runner_runs_blocks_in_one_namespace_and_compares_output(tmp_path: Path) -> None:
    results = _page(
        tmp_path,
        """
        <!-- docs: setup
        base = 40
        -->
        ```python
        value = base + 2
        ```

        ```python
        print("answer:", value, "and more")
        ```
        <!-- docs: output -->
        ```text
        answer: 42 ...
        ```
        ```toml
        a = 1
        ```
        """,
    )
    assert [r["status"] for r in results] == ["ran", "ran", "ran", "compared", "parsed"]


def test_runner_fails_on_wrong_output(tmp_path: Path) -> None:
    results = _page(
        tmp_path,
        """
        ```python
        print(1 + 1)
        ```
        <!-- docs: output -->
        ```text
        3
        ```
        """,
    )
    assert results[-1]["status"] == "fail"
    assert "The page shows:\n3" in results[-1]["error"]


def test_runner_requires_a_reason_to_skip(tmp_path: Path) -> None:
    results = _page(
        tmp_path,
        """
        <!-- docs: skip -->
        ```python
        raise SystemExit
        ```
        <!-- docs: skip (installs packages) -->
        ```bash
        pip install something
        ```
        """,
    )
    assert results[0]["status"] == "fail"
    assert "needs a reason" in results[0]["error"]
    assert results[1] == {**results[1], "status": "skipped", "reason": "installs packages"}


def test_runner_refuses_silent_shell_blocks_and_unlabelled_blocks(tmp_path: Path) -> None:
    results = _page(
        tmp_path,
        """
        ```bash
        pip install something
        ```
        """,
    )
    assert results[0]["status"] == "fail"
    assert "not `pipekit-train`" in results[0]["error"]
    results = _page(tmp_path, "```\nx = 1\n```\n")
    assert results[0]["status"] == "fail"
    assert "needs a language" in results[0]["error"]


def test_runner_reports_a_python_error_with_its_line(tmp_path: Path) -> None:
    results = _page(
        tmp_path,
        """
        ```python
        undefined_name
        ```
        """,
    )
    assert results[0]["status"] == "fail"
    assert "NameError" in results[0]["error"] and 'page.md", line 3' in results[0]["error"]


def test_runner_runs_the_cli_and_checks_the_exit_status(tmp_path: Path) -> None:
    results = _page(
        tmp_path,
        """
        <!-- docs: exit 2 -->
        ```bash
        pipekit-train run missing.toml
        ```
        ```bash
        pipekit-train run missing.toml
        ```
        """,
    )
    assert results[0]["status"] == "ran", results[0]
    assert results[1]["status"] == "fail"
    assert "exited 2 (expected 0)" in results[1]["error"]
