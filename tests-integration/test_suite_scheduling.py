"""The root conftest's work units name files that exist (a renamed file would silently fall
back to the default order, or leave a Ray file outside the one-Ray-at-a-time unit)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _root_conftest() -> Any:
    spec = importlib.util.spec_from_file_location("pipekit_root_conftest", ROOT / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_named_test_file_exists() -> None:
    conftest = _root_conftest()
    named = [*conftest.RAY_FILES, *conftest.GOLDEN_FILES, *conftest.PER_TEST_FILES]
    named += [unit for unit in conftest.LONGEST if unit not in ("ray", "golden")]
    missing = [path for path in named if not (ROOT / path).is_file()]
    assert missing == []
    assert len(set(conftest.LONGEST)) == len(conftest.LONGEST)


def test_units_group_ray_and_golden_files_and_split_docs_pages() -> None:
    conftest = _root_conftest()
    assert {conftest._file_of(f"{path}::test_x") for path in conftest.RAY_FILES} == {"ray"}
    assert {conftest._file_of(f"{p}::test_x") for p in conftest.GOLDEN_FILES} == {"golden"}
    page = "tests-integration/test_docs_examples.py::test_page_blocks_run[docs/cli.md]"
    assert conftest._file_of(page) == page
    other = "packages/core/tests/test_core_cli.py::test_x"
    assert conftest._file_of(other) == "packages/core/tests/test_core_cli.py"
