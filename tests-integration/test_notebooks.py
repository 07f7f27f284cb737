"""The documentation notebooks execute top to bottom, and their stored outputs are current."""

from __future__ import annotations

import base64
import copy
import importlib.util
import io
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "docs" / "notebooks"
SCRIPT = ROOT / "scripts" / "execute_notebooks.py"


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("pipekit_execute_notebooks", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("name", ["quickstart.ipynb", "cycle_handoff.ipynb"])
def test_notebook_runs_and_its_stored_outputs_are_current(name: str, tmp_path: Path) -> None:
    """The run `scripts/execute_notebooks.py --check` makes: execute the notebook as written
    (where a downloaded notebook would run: a folder outside the repository) and compare
    the fresh outputs with the stored ones the site shows."""
    pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    script = _script()
    fresh = script.execute(NOTEBOOKS / name, tmp_path)
    errors = [
        o
        for c in fresh.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors
    assert not [p.name for p in NOTEBOOKS.iterdir() if p.suffix != ".ipynb"], "files left behind"
    assert not list(tmp_path.iterdir()), "files left behind in the working directory"
    problems = script.differences(nbformat.read(NOTEBOOKS / name, as_version=4), fresh)
    assert not problems, (
        f"{name}'s stored outputs are stale; run `uv run python scripts/execute_notebooks.py "
        f"{name}` and commit the result:\n" + "\n".join(problems)
    )


def test_stale_outputs_are_detected() -> None:
    """`differences` catches a changed figure and changed text, and ignores timings."""
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("matplotlib")
    script = _script()
    stored = nbformat.read(NOTEBOOKS / "quickstart.ipynb", as_version=4)
    assert script.differences(stored, stored) == []
    fresh = copy.deepcopy(stored)
    streams = [
        o
        for c in fresh.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "stream"
    ]
    streams[0]["text"] = re.sub(
        r"in [\d.]+s \([\d.]+ steps/s\)", "in 9.9s (1.0 steps/s)", streams[0]["text"]
    )
    assert script.differences(stored, fresh) == [], "a timing is not a change"
    streams[0]["text"] = streams[0]["text"].replace("equinox:", "keras:")
    assert script.differences(stored, fresh), "changed text was not noticed"
    fresh = copy.deepcopy(stored)
    figures = [
        o
        for c in fresh.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if "image/png" in o.get("data", {})
    ]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    figures[0]["data"]["image/png"] = base64.b64encode(buffer.getvalue()).decode()
    assert any("figure" in p for p in script.differences(stored, fresh))


@pytest.mark.parametrize("name", ["quickstart.ipynb", "cycle_handoff.ipynb"])
def test_notebook_is_self_contained(name: str) -> None:
    """A notebook downloaded from the site runs: it imports nothing from the repository."""
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    for needle in ("sys.path", "examples", "toymodels", "../"):
        assert needle not in code, f"{name} uses {needle!r}: define what it needs inline"


@pytest.mark.parametrize("name", ["quickstart.ipynb", "cycle_handoff.ipynb"])
def test_notebook_stores_its_outputs(name: str) -> None:
    """The docs render the stored outputs: every code cell ran, none failed, a figure shows.

    Refresh them with `uv run python scripts/execute_notebooks.py` after editing a notebook
    (or when the test above finds them stale).
    """
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code), f"{name} has cells that were not run"
    outputs = [o for c in code for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), f"{name} shows no figure"
