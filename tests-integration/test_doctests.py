"""The `>>>` examples in the docstrings of every package run, as written.

One case per module that has examples (found by scanning the sources, so collecting this
file imports nothing). Each example runs in a namespace of its own, not in the module's
globals: an example must import what it uses, so a reader can paste it as is. Backend
modules import their framework inside the test (the rest of the suite does too, so a
full run pays for torch and keras once). `# doctest: +SKIP` marks a line that would
train for too long here.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).parts  # packages/<pkg>/src/pipekit_train/<pkg>/...
    dotted = ".".join(parts[3:]).removesuffix(".py")
    return dotted.removesuffix(".__init__")


def _modules_with_examples() -> list[str]:
    paths = sorted(ROOT.glob("packages/*/src/pipekit_train/**/*.py"))
    return [_module_name(p) for p in paths if ">>>" in p.read_text(encoding="utf-8")]


MODULES = _modules_with_examples()


def test_examples_are_found() -> None:
    assert len(MODULES) >= 10, MODULES
    assert "pipekit_train.core.data.batching._engine" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    tests = doctest.DocTestFinder(exclude_empty=True).find(module, name, globs={})
    tests = [t for t in tests if t.examples]
    assert tests, f"{name} has `>>>` in its source but no docstring example was collected"
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report: list[str] = []
    for test in tests:
        test.globs = {"__name__": f"{name}.__doctest__"}  # self-contained: no module globals
        runner.run(test, out=report.append, clear_globs=True)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, "".join(report)
    assert result.attempted > 0
